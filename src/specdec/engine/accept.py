"""The lossless acceptance rules: which draft tokens the target would have produced anyway.

Why: speculative decoding is only worth having if it changes nothing but speed.
The acceptance rule is where that is won or lost: given a draft tree and the
target's logits at every node (one forward pass), it decides which draft tokens
the target "would have produced anyway" and emits them, plus one token drawn
from the target itself. Everything here is small, model-free and testable by
distribution: `tests/test_sampling.py` checks every rule against the target's
own distribution of the first and first two emitted tokens. The sampling parameters
and the logits -> probabilities transform the rules apply are `specdec.sampling`'s.

Invariants (every rule):
- node i's row of `target_probs` / `target_logits` is the target's distribution
  for the token *after* node i (the child of node i), given the path to node i;
- the root (node 0) is always on the accepted path and is never emitted again:
  it was decided (and emitted) by the previous step;
- `Acceptance.tokens` = the tokens of `path[1:]`, then exactly one more token:
  a *bonus* token (drawn from the target at the last accepted node, when the
  walk ended at a leaf or, for deterministic drafts, when the target's own draw
  left the tree) or a *recovered* token (drawn from the residual after a
  rejection). So every step emits at least one token;
- lossless: at temperature 0 the emitted tokens are the target's argmax chain;
  at temperature > 0 they are distributed exactly as tokens drawn one by one
  from `logits_to_probs(target_logits)` along the path;
- randomness only through the explicit `generator` (on the target rows' device,
  where `draft_probs` must live too), each choice made by a `Chance` with a uniform
  of its own (tests pass one that enumerates them); probabilities in float32, the uniforms
  and the sampling CDF in float64; given `positions` (`specdec.engine.uniforms`, as the
  engines do), every emitted token is drawn with its output position's uniform,
  so deterministic drafts emit exactly what plain sampling emits with that seed;
- siblings with draft probabilities must be drawn independently given their
  parent (with replacement), each from its own `draft_probs` row: that is what
  the multi-draft rule's losslessness rests on.

The rules:
- `accept_greedy`: walk down while a child's token is the target's argmax.
- `accept_deterministic` (drafts without probabilities: retrieval, lookup): draw
  the target's own token at each node; follow the child with that token if
  there is one, else emit the draw and stop. This is exactly "sample from the
  target", with the tree only deciding how far one step gets.
- `accept_speculative_chain`: speculative sampling (Leviathan et al. 2023,
  arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318): accept a draft token x
  drawn from the draft distribution with probability min(1, target(x)/draft(x));
  on rejection draw from norm(max(0, target - draft)).
- `accept_multi_draft`: multi-step / recursive rejection sampling over siblings
  (SpecInfer, Miao et al. 2024, arXiv 2305.09781, section 4.3): the siblings
  are tried in turn against a residual that shrinks after every rejection. A
  chain is the one-child case, so both rules share one walk (`_rejection_walk`).
  A deterministic guess among drawn drafts carries a point mass as its row
  (`point_mass_rows`), so retrieval and draft-model branches share one tree.
- `accept_spectr`: the same walk, but a run of siblings drawn i.i.d. from one
  draft row is verified at once by SpecTr's k-sequential selection (Sun et al.
  2023, arXiv 2310.15141; `specdec.engine.spectr`), which accepts more often where the
  draws repeat a token the target likes less than the draft does. Siblings
  with rows of their own stay SpecInfer's groups of one (`sibling_groups`).
  Correct for i.i.d. siblings only: the tree invariant below (with replacement,
  never merged) is what it rests on, as SpecInfer's rule does. After either
  rule accepts a token, the walk descends into that token's expanded twin.

Cost: every rule only needs the target rows on the path it walks, so rows are
made on first use (`_TargetRows`): at N = 64, V = 49152 a softmax over all rows,
and a top-p sort even more, costs many times the path's few rows (docs/benchmarks.md,
"Measurements behind design choices"). Tokens are drawn by inverse CDF from one float64
uniform (faster than torch.multinomial over the vocabulary on CPU), and each step
takes all its uniforms from the generator at once, one per node.

Numerical corner: a residual norm(max(0, r - draft)) can sum to ~0 in float32
even though the rejection that asks for it happened (in exact arithmetic a
residual of mass m is only needed with probability m, so mass 0 means the
rejection was impossible; rounding lets it happen anyway). When the mass is
below `RESIDUAL_EPS` we keep r itself (the distribution the rejected draft was
being matched against: the target at this node for a chain, the current
residual for siblings). The rejection happened with probability < RESIDUAL_EPS,
so whatever is drawn then moves the output distribution by less than that in
total variation, and we never divide by ~0 or sample from an all-zero row.
Keeping r rather than restarting from the target row also keeps the invariant
the later siblings rely on (the token leaving the node is distributed as r).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.backends.registry import argmax_rows, greedy_walk
from specdec.engine.decide import (
    RESIDUAL_EPS,
    argmax_at_every_node,
    drawn_at_every_node,
    rejection_outcomes,
    walk_rejections,
)
from specdec.engine.spectr import KSequential, expanded_twin, sibling_groups
from specdec.engine.uniforms import Chance, PositionUniforms, draw
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.tree import DraftTree

MULTI_DRAFT_RULES = ("specinfer", "spectr")  # how drawn siblings are verified (`accept`'s multi_draft)


@dataclass(frozen=True)
class Acceptance:
    path: list[int]  # accepted node indices, root first (the root is always on the path)
    tokens: list[int]  # tokens of path[1:], then one bonus or recovered token

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


# ---------------------------------------------------------------------- helpers
class _TargetRows:
    """Node -> [V] float32 target distribution, made on first use and kept.

    source: [N, V] target probabilities (params None) or target logits (params given).
    """

    def __init__(self, source: torch.Tensor, params: SamplingParams | None = None) -> None:
        self.source, self.params, self.done = source, params, {}
        self.device = source.device

    def __getitem__(self, node: int) -> torch.Tensor:
        row = self.done.get(node)
        if row is None:
            row = (
                self.source[node].float()
                if self.params is None
                else logits_to_probs(self.source[node], self.params)
            )
            self.done[node] = row
        return row


def _check_rows(tree: DraftTree, rows: torch.Tensor, name: str) -> None:
    if rows.dim() != 2 or rows.shape[0] != tree.num_nodes:
        raise ValueError(
            f"{name} must be [N, V] with N = {tree.num_nodes} tree nodes, got {tuple(rows.shape)}"
        )
    if tree.draft_probs is not None and tree.draft_probs.shape[1] != rows.shape[1]:
        raise ValueError(
            f"{name} has V = {rows.shape[1]} but draft_probs has V = {tree.draft_probs.shape[1]}"
        )


def _chance(tree: DraftTree, source: torch.Generator | Chance | None, device: torch.device) -> Chance:
    """A `Chance` as given, or one uniform per node from the generator."""
    return source if isinstance(source, Chance) else Chance.per_node(tree.num_nodes, source, device)


def draw_next(logits: torch.Tensor, params: SamplingParams, positions: PositionUniforms) -> int:
    """One token from logits [V] for the next output position (its uniform, inverse CDF); greedy: argmax."""
    if params.greedy:
        token = int(logits.argmax())
    else:
        token = draw(logits_to_probs(logits, params), positions.at(0))
    positions.advance(1)
    return token


def _residual(base: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, base - draft)) for base, draft [V] float32; `base` itself if that has ~0 mass."""
    return _normalised((base - draft).clamp_(min=0), base)


def _normalised(excess: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """excess [V] (>= 0) normalised; `base` itself if it has ~0 mass (see module docstring)."""
    mass = float(excess.sum())
    if mass < RESIDUAL_EPS:  # the rejection had probability < RESIDUAL_EPS
        return base
    return excess.div_(mass)


def point_mass_rows(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V] float32 draft rows with all mass on each node's token: a deterministic guess as a draft.

    tokens: [N] int64. A tree mixing deterministic guesses (retrieval) and drawn drafts
    carries these rows for its guesses, so the multi-draft rule verifies both at once: a
    guess x is accepted with probability r(x), else x leaves the residual (exactly what
    the deterministic walk does for it), and the drawn siblings are tried after.
    """
    rows = torch.zeros(tokens.shape[0], vocab_size, dtype=torch.float32, device=tokens.device)
    return rows.scatter_(1, tokens[:, None], 1.0)


def _is_chain(tree: DraftTree) -> bool:
    return tree.parent_list == list(range(-1, tree.num_nodes - 1))


# ------------------------------------------------------------------------ rules
def accept_greedy(tree: DraftTree, target_logits: torch.Tensor, one_transfer: bool | None = None) -> Acceptance:
    """Temperature 0: follow the target's argmax through the tree.

    target_logits: [N, V], row i scores the child of node i. On an accelerator (or with
    one_transfer, which the tests set on CPU tensors): one argmax over all rows, one host
    transfer (the step's one sync), then a Python walk over the children.
    On CPU, torch's argmax over a 49152-wide row is not vectorised, and the walk only
    needs the rows on the accepted path; so there each of those rows is reduced on its
    own: the cost follows the tokens emitted, not the tree's size. specdec's kernel
    walks the whole path in one call (`greedy_walk`, reading a bf16 row as it is);
    without it numpy reduces each row, after a conversion to fp32 (docs/benchmarks.md).
    Ties go to the lowest token id in all three, as in plain greedy decoding.
    """
    _check_rows(tree, target_logits, "target_logits")
    if one_transfer is None:
        one_transfer = target_logits.device.type != "cpu"
    if not one_transfer:
        rows = target_logits.detach()
        walked = greedy_walk(rows, tree.token_list, tree.parent_list)  # the walk below, in one kernel call
        if walked is not None:
            return Acceptance(*walked)

        def best(node: int) -> int:  # bf16 -> fp32 is exact, so the argmax is unchanged
            kernel = argmax_rows(rows[node : node + 1])
            return kernel[0] if kernel is not None else int(rows[node].float().numpy().argmax())

    else:
        best = argmax_at_every_node(target_logits).tolist().__getitem__  # [N] -> list: the only sync
    # no child is the argmax (or a leaf): the argmax is the bonus / correction
    return _deterministic_walk(tree, lambda node, _depth: best(node))


def accept_deterministic(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator | Chance | None,
    positions: PositionUniforms | None = None,
) -> Acceptance:
    """Drafts without probabilities (retrieval): sample the target, follow the tree while it agrees.

    target_probs: [N, V] float32, row i = target distribution for the child of node i.
    At each node on the path one token is drawn from its target row (depth + 1 draws);
    a child with that token is accepted, else the draw is the final token. Every
    emitted token is a draw from the target given the emitted prefix, so this is
    lossless for any tree; in a trie (merged siblings) no rule accepts more. With
    duplicate siblings the first is taken and the others' subtrees are wasted, not wrong.
    positions: draw the d-th token of this step with the uniform of its output position
    (then the emitted tokens do not depend on the tree at all), and move them past what
    was emitted; None: one uniform per node.
    """
    _check_rows(tree, target_probs, "target_probs")
    drawn = _drawn_on_the_path(tree, _TargetRows(target_probs), generator, positions)
    acceptance = _deterministic_walk(tree, drawn)
    if positions is not None:
        positions.advance(len(acceptance.tokens))
    return acceptance


def _drawn_on_the_path(
    tree: DraftTree,
    rows: _TargetRows,
    generator: torch.Generator | Chance | None,
    positions: PositionUniforms | None,
) -> Callable[[int, int], int]:
    """(node, depth) -> the target's draw there, each row made and drawn when the walk reaches it (CPU)."""
    chance = _chance(tree, generator, rows.device) if positions is None else Chance.by_output_position(positions)
    return lambda node, depth: chance.draw(depth if chance.by_position else node, rows[node])


def _deterministic_walk(tree: DraftTree, drawn: Callable[[int, int], int]) -> Acceptance:
    """Follow the child whose token is the target's draw at each node; drawn(node, depth) gives that draw."""
    tokens, children = tree.token_list, tree.children
    node, path, emitted = 0, [0], []
    while True:
        want = drawn(node, len(emitted))
        emitted.append(want)
        for child in children[node]:
            if tokens[child] == want:
                break
        else:
            return Acceptance(path, emitted)
        node = child
        path.append(node)


def accept_speculative_chain(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | Chance | None
) -> Acceptance:
    """Speculative sampling on a chain (Leviathan et al. 2023; Chen et al. 2023).

    tree: a chain with draft_probs [N, V]; token i (i >= 1) was drawn from draft_probs[i].
    target_probs: [N, V] float32, row i = target distribution for token i + 1.
    Token i is accepted when u_i * draft(x_i) < target(x_i), u_i ~ U[0, 1): probability
    min(1, target / draft). The first rejection ends the step with a recovered token
    from norm(max(0, target - draft)); a fully accepted chain ends with a bonus token
    from the last node's target row. This is the one-child case of the multi-draft
    rule, and runs the same walk.
    """
    _check_rows(tree, target_probs, "target_probs")
    if tree.draft_probs is None or not _is_chain(tree):
        raise ValueError("accept_speculative_chain needs a chain with draft_probs")
    return _rejection_walk(tree, _TargetRows(target_probs), _chance(tree, generator, target_probs.device))


def accept_multi_draft(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | Chance | None
) -> Acceptance:
    """Recursive rejection sampling over siblings (SpecInfer, Miao et al. 2024, section 4.3).

    tree: any tree with draft_probs [N, V]; each node's token was drawn from its own row,
    independently of its siblings given the path to the parent (sampling with
    replacement: duplicate siblings are allowed and must stay unmerged).
    target_probs: [N, V] float32, row i = target distribution for the children of node i.
    At a node the residual r starts as the target row; child c (token x, draft row q)
    is accepted when u_c * q(x) < r(x), i.e. with probability min(1, r(x) / q(x)), and
    each rejection sets r = norm(max(0, r - q)). Accepted: descend. All children
    rejected, or a leaf: the final token is drawn from r. Each child is one round of
    plain speculative sampling against the previous residual, so by induction the
    token leaving a node is distributed as its target row.
    """
    _check_rows(tree, target_probs, "target_probs")
    if tree.draft_probs is None:
        raise ValueError("accept_multi_draft needs draft_probs")
    return _rejection_walk(tree, _TargetRows(target_probs), _chance(tree, generator, target_probs.device))


def accept_spectr(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | Chance | None
) -> Acceptance:
    """SpecTr's k-sequential selection over each run of siblings that share one draft row.

    tree: as for `accept_multi_draft`; a run of k siblings with one row must be k i.i.d.
    draws from it (with replacement, undeduplicated, k fixed before drawing), which is how
    `eagle:sampled=true` draws. A run is accepted or rejected as a whole (`specdec.engine.spectr`),
    and what it leaves becomes the residual the next run is matched against, so mixed trees
    (hybrid's point-mass guesses beside drawn chains) stay lossless too.
    """
    _check_rows(tree, target_probs, "target_probs")
    if tree.draft_probs is None:
        raise ValueError("accept_spectr needs draft_probs")
    return _rejection_walk(tree, _TargetRows(target_probs), _chance(tree, generator, target_probs.device), "spectr")


def _rejection_walk(tree: DraftTree, rows: _TargetRows, chance: Chance, rule: str = "specinfer") -> Acceptance:
    draft_probs = tree.draft_probs  # [N, V]
    index = tree.tokens[:, None].to(draft_probs.device)  # [N, 1]
    draft_at = draft_probs.gather(1, index)[:, 0].tolist()  # [N] draft(x_i), one sync
    tokens, children = tree.token_list, tree.children
    node, path = 0, [0]
    while True:  # child c is tested with key c; key 0 (the root needs no test) draws the final token
        residual = rows[node]  # [V], the target row until a child is rejected
        for group in sibling_groups(tree, children[node], rule):
            if len(group) == 1:  # one draft: min(1, r / q), then r = norm(max(0, r - q))
                child = group[0]
                if chance.below(child, float(residual[tokens[child]]), draft_at[child]):
                    break
                residual = _residual(residual, draft_probs[child])
                continue
            selection = KSequential.solve(residual, draft_probs[group[0]], len(group))
            child = next((c for c in group if chance.below(c, *selection.odds(tokens[c], draft_at[c]))), None)
            if child is not None:
                break
            residual = _normalised(selection.excess(), residual)
        else:  # every child rejected (recovered token), or a leaf (bonus token)
            final = chance.draw(0, residual)
            return Acceptance(path, [tokens[i] for i in path[1:]] + [final])
        node = expanded_twin(tree, children[node], child)
        path.append(node)


def accept(
    tree: DraftTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    positions: PositionUniforms | None = None,
    multi_draft: str = "specinfer",
    one_transfer: bool | None = None,
) -> Acceptance:
    """Pick the rule: greedy; else deterministic drafts, or rejection sampling (chain or tree).

    multi_draft: how drawn siblings are verified, "specinfer" (one by one) or "spectr"
    (k-sequential selection); it changes nothing for greedy, deterministic drafts or chains.

    target_logits: [N, V] raw target logits, row i scores the child of node i.
    logits_to_probs runs only on the rows the walk reaches. positions: the request's
    uniforms by output position (deterministic drafts draw with them; rejection
    sampling draws from `generator` and only moves them past what it emitted).
    one_transfer (default: on an accelerator): every node decided on the device and the
    step's decisions brought back in one transfer (`decide`); SpecTr's trees of drawn
    siblings still walk node by node.
    """
    if multi_draft not in MULTI_DRAFT_RULES:
        raise ValueError(f"multi_draft must be one of {', '.join(MULTI_DRAFT_RULES)}, got {multi_draft!r}")
    if one_transfer is None:
        one_transfer = target_logits.device.type != "cpu"
    decided = decide(tree, target_logits, params, generator, positions, multi_draft) if one_transfer else None
    if decided is not None:
        return accept_decided(tree, decided.tolist(), params, positions)  # the step's one sync
    if params.greedy:
        acceptance = accept_greedy(tree, target_logits, one_transfer=False)
    else:
        _check_rows(tree, target_logits, "target_logits")  # greedy's rule and `decide` check their own
        rows = _TargetRows(target_logits, params)
        if tree.draft_probs is not None:
            acceptance = _rejection_walk(tree, rows, _chance(tree, generator, rows.device), multi_draft)
        else:
            acceptance = _deterministic_walk(tree, _drawn_on_the_path(tree, rows, generator, positions))
    if positions is not None:
        positions.advance(len(acceptance.tokens))
    return acceptance


def decide(
    tree: DraftTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    positions: PositionUniforms | None = None,
    multi_draft: str = "specinfer",
) -> torch.Tensor | None:
    """Every node's decision for `accept`'s rule, on the device, not yet read back (`specdec.engine.decide`):
    the argmax (greedy), the target's draw (deterministic drafts) or every node's tests and final token
    (rejection sampling: a chain, or SpecInfer's siblings); None for a tree under SpecTr's rule (its runs of
    siblings are selected on the host: `torch.equal` on their rows alone would wait), which walks node by
    node. Read it back (with other rows' decisions, in one transfer) and walk it with `accept_decided`."""
    _check_rows(tree, target_logits, "target_logits")
    if params.greedy:
        return argmax_at_every_node(target_logits)
    if tree.draft_probs is None:
        return drawn_at_every_node(tree, target_logits, params, generator, positions)
    if multi_draft == "spectr" and not _is_chain(tree):
        return None
    return rejection_outcomes(tree, target_logits, params, generator)


def accept_decided(
    tree: DraftTree, decided: list[int], params: SamplingParams, positions: PositionUniforms | None = None
) -> Acceptance:
    """The acceptance walked over `decide`'s values, read back; moves positions past what it emitted."""
    if params.greedy or tree.draft_probs is None:
        acceptance = _deterministic_walk(tree, lambda node, _depth: decided[node])
    else:
        path, final = walk_rejections(tree, decided)
        acceptance = Acceptance(path, [tree.token_list[i] for i in path[1:]] + [final])
    if positions is not None:
        positions.advance(len(acceptance.tokens))
    return acceptance

"""What an acceptance rule decides at every node of a tree, computed on the device at once.

Why: on an accelerator every value the host reads back waits for the device (a
sync), and the acceptance walk reads one value per emitted token: the argmax, or
the target's draw, or a chain's accept test, at each node it reaches. Deciding
every node at once on the device costs the rows off the path (cheap there) and
lets the step's decisions come back in one transfer: one row's (`accept`'s
`one_transfer`) or every row's of a batched step (`verify`). The CPU keeps the
lazy walk, which makes only the rows on the path (`accept`).

Invariants:
- each node is decided with exactly the arithmetic and the uniform the
  row-by-row walk gives it, so walking the decided values emits the CPU walk's
  path and tokens with the same seed, and spends the same uniforms
  (tests/test_one_transfer.py); the decisions therefore inherit the CPU rules'
  exact distribution checks;
- nothing here reads a value back: every function returns device tensors
  (int64), so a caller concatenates them and transfers once; the few host
  tensors sent over (tokens, depths) go without a wait (`non_blocking`: a
  blocking copy to a GPU waits for its stream, the pass included);
- drawn siblings are decided here too (SpecInfer's rule): a residual depends on
  the rejections of the siblings before it, but only on those, so each node's
  chain of residuals is computed a sibling rank at a time, whichever path the
  walk takes. SpecTr's runs of i.i.d. siblings (k-sequential selection, which
  solves a small problem per run on the host) stay with `accept`'s walk.
"""

from __future__ import annotations

import torch

from specdec.engine.spectr import expanded_twin
from specdec.engine.uniforms import PositionUniforms, draw_rows
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.tree import DraftTree

# Below this residual mass a rejection is a rounding artefact (`specdec.engine.accept`'s docstring).
RESIDUAL_EPS = 1e-6


def argmax_at_every_node(target_logits: torch.Tensor) -> torch.Tensor:
    """[N] the target's argmax at every node (ties to the lowest id, as greedy decoding breaks them)."""
    return target_logits.argmax(-1)


def drawn_at_every_node(
    tree: DraftTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    positions: PositionUniforms | None = None,
) -> torch.Tensor:
    """[N] the target's draw at every node, with the uniform the deterministic walk would give it.

    Node n draws with its depth's output-position uniform (positions given) or the n-th of N
    uniforms from the generator (the values `Chance.per_node` takes), so the walk over these
    tokens emits what the row-by-row walk emits. Rows off the path are computed for nothing:
    cheap on an accelerator, ~N times the path's work on a CPU.
    """
    device, num_nodes = target_logits.device, tree.num_nodes
    if positions is None:
        uniforms = torch.rand(num_nodes, generator=generator, device=device, dtype=torch.float64)
    else:
        at_depth = [positions.at(depth) for depth in range(tree.max_depth + 1)]
        at_depth = torch.tensor(at_depth, dtype=torch.float64).to(device, non_blocking=True)
        uniforms = at_depth[tree.depths.to(device, non_blocking=True)]
    return draw_rows(logits_to_probs(target_logits, params), uniforms)


def rejection_outcomes(
    tree: DraftTree, target_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """[2N - 1] the multi-draft rule's every outcome on a tree of N nodes with draft probabilities (SpecInfer's
    one sibling at a time; a chain is speculative sampling): whether child c (c = 1 .. N - 1) passes its test,
    then the final token were the walk to stop at node j (j = 0 .. N - 1), drawn from j's residual after
    every child of j was rejected (j's target row for a leaf: the bonus).

    A node's residual starts as its target row r_0 = p_j, and its children are tried in order: child c
    (token x, draft row q) passes when u_c * q(x) < r(x), and its rejection sets r = norm(max(0, r - q)).
    These depend on the node's own row and children only, never on which path reached it, so every node's
    tests and final are computed here, a sibling rank at a time over all nodes (one pass of a few kernels
    per rank, a chain's one). The uniforms are the rejection walk's: N from the generator, u_c for child
    c's test and u_0 for the final draw; a residual of mass below `RESIDUAL_EPS` keeps r, as the walk's
    does. `walk_rejections` reads the result.
    """
    probs = logits_to_probs(target_logits, params)  # [N, V] float32
    num_nodes, device = tree.num_nodes, probs.device
    uniforms = torch.rand(num_nodes, generator=generator, device=device, dtype=torch.float64)
    tokens = tree.tokens.to(device, non_blocking=True)
    draft = tree.draft_probs.to(device)
    draft_at = draft.gather(1, tokens[:, None])[:, 0].double()  # [N] q(x_c)
    passed = torch.zeros(num_nodes, dtype=torch.bool, device=device)
    residual = probs  # [N, V] each node's residual before its next child is tried (`probs` is our own tensor)
    ranks = _sibling_ranks(tree.children)
    flat = torch.tensor([i for rank in ranks for i in rank], dtype=torch.int64).to(device, non_blocking=True)
    at = 0
    for rank in ranks:  # one host-to-device copy above, then slices of it
        half = len(rank) // 2
        node, child = flat[at : at + half], flat[at + half : at + len(rank)]
        at += len(rank)
        base = residual[node]  # [m, V]
        passed[child] = uniforms[child] * draft_at[child] < base.gather(1, tokens[child, None])[:, 0].double()
        excess = (base - draft[child]).clamp(min=0)
        mass = excess.sum(-1, keepdim=True)
        residual.index_copy_(0, node, torch.where(mass < RESIDUAL_EPS, base, excess / mass))  # base was copied out
    finals = draw_rows(residual, uniforms[:1].expand(num_nodes))
    return torch.cat([passed[1:].long(), finals])


def _sibling_ranks(children: list[list[int]]) -> list[list[int]]:
    """For rank r = 0, 1, ...: the nodes with more than r children, then each one's r-th child."""
    ranks = []
    for rank in range(max(map(len, children), default=0)):
        nodes = [node for node, kids in enumerate(children) if len(kids) > rank]
        ranks.append(nodes + [children[node][rank] for node in nodes])
    return ranks


def walk_rejections(tree: DraftTree, outcomes: list[int]) -> tuple[list[int], int]:
    """(path, final token) from `rejection_outcomes`' values: at each node the first child that passed
    (descending into its expanded twin, as the walk does), until a node has none; its final token ends it."""
    num_nodes, children = tree.num_nodes, tree.children
    passed, finals = outcomes[: num_nodes - 1], outcomes[num_nodes - 1 :]
    node, path = 0, [0]
    while True:
        child = next((c for c in children[node] if passed[c - 1]), None)
        if child is None:
            return path, finals[node]
        node = expanded_twin(tree, children[node], child)
        path.append(node)

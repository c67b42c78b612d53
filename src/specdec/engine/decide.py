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
- drawn siblings (trees with draft probabilities that are not chains) are not
  decided here: each residual depends on the rejections before it, so their
  walk stays node by node (`accept`'s rejection walk).
"""

from __future__ import annotations

import torch

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


def chain_outcomes(
    chain: DraftTree, target_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """[2N - 1] speculative sampling's every outcome on a chain of N nodes with draft probabilities:
    whether draft token c (c = 1 .. N - 1) passes its test, then the final token were the walk to
    stop at node j (j = 0 .. N - 1): drawn from the residual norm(max(0, p_j - q_{j+1})) of the
    rejection after node j, or for j = N - 1 from the last target row (the bonus).

    The uniforms are the rejection walk's: N from the generator, u_c for child c's test
    (u_c * q(x_c) < p(x_c)) and u_0 for the final draw; a residual of mass below
    `RESIDUAL_EPS` falls back to the target row, as the walk's does. `walk_chain` reads the result.
    """
    probs = logits_to_probs(target_logits, params)  # [N, V] float32
    num_nodes = chain.num_nodes
    uniforms = torch.rand(num_nodes, generator=generator, device=probs.device, dtype=torch.float64)
    tokens = chain.tokens.to(probs.device, non_blocking=True)
    draft = chain.draft_probs.to(probs.device)
    draft_at = draft.gather(1, tokens[:, None])[:, 0].double()  # [N] q(x_c)
    target_at = probs[:-1].gather(1, tokens[1:, None])[:, 0].double()  # [N - 1] p_{c-1}(x_c)
    passed = uniforms[1:] * draft_at[1:] < target_at
    excess = (probs[:-1] - draft[1:]).clamp(min=0)
    mass = excess.sum(-1, keepdim=True)
    residual = torch.where(mass < RESIDUAL_EPS, probs[:-1], excess / mass)
    finals = draw_rows(torch.cat([residual, probs[-1:]]), uniforms[:1].expand(num_nodes))
    return torch.cat([passed.long(), finals])


def walk_chain(num_nodes: int, outcomes: list[int]) -> tuple[list[int], int]:
    """(path, final token) from `chain_outcomes`' values: the nodes before the first failed test, and
    the final token drawn where the walk stopped."""
    passed, finals = outcomes[: num_nodes - 1], outcomes[num_nodes - 1 :]
    stop = next((c for c, ok in enumerate(passed, start=1) if not ok), num_nodes)
    return list(range(stop)), finals[stop - 1]

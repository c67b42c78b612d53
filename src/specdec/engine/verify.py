"""One verification step: a single target forward pass over every row's draft tree.

Why a module of its own: every method (retrieval, draft model, lookahead, plain
decoding) goes through exactly this, so losslessness lives in one place. The
target scores every node of every row at once, the acceptance rule picks, per
row, the path the target itself would have produced, the KV cache keeps only
those paths, and the logits at each row's last accepted node are handed on: the
emitted final token was drawn from them, and LogitSpec reads its next-next
candidates from them. On an accelerator the step's decisions come back in one
transfer, and with them the top ids at every node that the rows' proposers
read next (`tops`: LogitSpec's candidates, the recycle table's rows), so a
proposer that has them reads no logits and the step waits on the device once.

Invariants: a row's result depends only on its own tree, logits and draws (its
own generator and position uniforms), never on what shares the pass;
`result.tokens` is never empty (at least the bonus/recovered token) and
`result.tokens[:-1]` are the tokens of `result.path[1:]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from specdec.backends.registry import top_tokens
from specdec.engine.accept import Acceptance, accept, accept_decided, decide
from specdec.engine.uniforms import PositionUniforms
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

if TYPE_CHECKING:
    from specdec.backends.contract import Rows


@dataclass(frozen=True)
class Draws:
    """How one row draws its tokens: its sampling settings and its own random numbers."""

    sampling: SamplingParams
    generator: torch.Generator | None
    positions: PositionUniforms  # token t of the row is drawn with the t-th uniform (`uniforms`)
    multi_draft: str = "specinfer"  # drawn siblings: "specinfer" (one by one) or "spectr" (`spectr`)


@dataclass(frozen=True)
class VerifyResult:
    tokens: list[int]  # emitted: accepted draft tokens, then one bonus or recovered token
    path: list[int]  # accepted node indices, root first
    target_logits: torch.Tensor  # [N, V] target logits at every tree node (row i predicts i's child)
    tree: DraftTree
    features: torch.Tensor | None = None  # [N, F] the target's captured features at every node, if asked
    # [N, k] int64 on the host: the top-k target ids at every node, best first (`top_tokens`), read back with
    # the step's decisions (`verify`'s tops); None: not read back, a proposer reads `target_logits` itself
    tops: np.ndarray | None = None

    @property
    def next_logits(self) -> torch.Tensor:
        """[V] logits at the last accepted node: tokens[-1] was drawn from them."""
        return self.target_logits[self.path[-1]]

    @property
    def next_top(self) -> list[int] | None:
        """The top ids of `next_logits`, best first, where the step read them back (`tops`); else None."""
        return None if self.tops is None else self.tops[self.path[-1]].tolist()

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def verify(
    target: Rows,
    trees: Sequence[DraftTree],
    draws: Sequence[Draws],
    one_transfer: bool | None = None,
    tops: Sequence[int] | None = None,
    every_node: Sequence[bool] | None = None,
) -> list[VerifyResult]:
    """trees[b], draws[b]: row b's tree and draws -> row b's result, its accepted path committed.

    one_transfer (default: on an accelerator): every row's nodes decided on the device and read back
    together, the step's one sync (`accept.decide`); else each row walks its own path (the CPU's lazy walk).
    tops[b]: how many top ids at every node row b's proposer reads (`Proposer.top_wanted`), handed on in
    `VerifyResult.tops`: with one transfer they come back in it; else they are read right after the pass,
    one call a row, for the rows whose proposer reads every node's (`every_node[b]`,
    `Proposer.tops_at_every_node`; None: every row), and not at all for the others (such a proposer reads
    the few rows it needs from the logits). A CPU step's host work costs what its calls into compiled code
    cost with their code and data evicted by the pass's weights (docs/benchmarks.md, "The step around the
    pass"): one read here spares the proposer two (the recycle table's every row, then the next-next
    candidates' last row).
    """
    passes = target.verify_trees(trees)  # per row: logits [n_b, V], features; one forward pass
    logits = [target_logits for target_logits, _ in passes]
    if one_transfer is None:
        one_transfer = bool(logits) and logits[0].device.type != "cpu"
    if one_transfer:
        acceptances, top_ids = read_together(trees, logits, draws, tops)
    else:
        wanted = _wanted(logits, tops)
        if every_node is not None:
            wanted = [k if every else 0 for k, every in zip(wanted, every_node, strict=True)]
        top_ids = [top_tokens(rows, k).numpy() if k else None for rows, k in zip(logits, wanted, strict=True)]
        acceptances = [
            accept(tree, rows, row.sampling, row.generator, row.positions, row.multi_draft, one_transfer=False)
            for tree, rows, row in zip(trees, logits, draws, strict=True)
        ]
    results = [
        VerifyResult(acceptance.tokens, acceptance.path, rows, tree, features, top)
        for acceptance, tree, rows, (_, features), top in zip(acceptances, trees, logits, passes, top_ids, strict=True)
    ]
    target.commit([result.path for result in results])
    return results


def accept_together(
    trees: Sequence[DraftTree], logits: Sequence[torch.Tensor], draws: Sequence[Draws]
) -> list[Acceptance]:
    """Every row's acceptance from one transfer of every row's decisions (`read_together`, no top ids)."""
    return read_together(trees, logits, draws)[0]


def read_together(
    trees: Sequence[DraftTree],
    logits: Sequence[torch.Tensor],
    draws: Sequence[Draws],
    tops: Sequence[int] | None = None,
) -> tuple[list[Acceptance], list[np.ndarray | None]]:
    """Every row's acceptance, and the top `tops[b]` ids at every node of row b, from one transfer.

    A row that `decide` leaves to the walk (SpecTr's drawn siblings) walks on its own after it. Each row draws
    from its own generator, so the order rows decide in changes nothing."""
    wanted = _wanted(logits, tops)
    decided = [
        decide(tree, rows, row.sampling, row.generator, row.positions, row.multi_draft)
        for tree, rows, row in zip(trees, logits, draws, strict=True)
    ]
    top_rows = [top_tokens(rows, k) if k > 0 else None for rows, k in zip(logits, wanted, strict=True)]
    together = [values for values in decided if values is not None]
    together += [ids.reshape(-1) for ids in top_rows if ids is not None]
    flat = torch.cat(together).cpu().numpy() if together else np.empty(0, np.int64)  # the one sync
    acceptances, at = [], 0
    for tree, rows, row, values in zip(trees, logits, draws, decided, strict=True):
        if values is None:
            acceptances.append(accept(tree, rows, row.sampling, row.generator, row.positions, row.multi_draft))
            continue
        chosen = flat[at : at + values.numel()].tolist()
        acceptances.append(accept_decided(tree, chosen, row.sampling, row.positions))
        at += values.numel()
    top_ids: list[np.ndarray | None] = []
    for ids in top_rows:
        top_ids.append(None if ids is None else flat[at : at + ids.numel()].reshape(ids.shape))
        at += 0 if ids is None else ids.numel()
    return acceptances, top_ids


def _wanted(logits: Sequence[torch.Tensor], tops: Sequence[int] | None) -> list[int]:
    """How many top ids to read at every node of each row: `tops[b]`, at most the vocabulary (0 without tops)."""
    if tops is None:
        return [0] * len(logits)
    return [min(k, rows.shape[-1]) for k, rows in zip(tops, logits, strict=True)]

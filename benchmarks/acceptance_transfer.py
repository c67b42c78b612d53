"""A step's acceptance on the device: every row read back at once against each row walking its own path.

    .venv/bin/python benchmarks/acceptance_transfer.py     (a dry run on a CPU; `gpu_check.py random` runs it)

Synthetic rows over SmolLM2's vocabulary (49,152), 1 and 8 rows of 16-node chains, for greedy rows, sampled
rows with deterministic drafts and drawn chains (speculative sampling, drafts drawn from the target itself so
every test passes): ms per step for `verify.accept_together` (`decide` on every row, one transfer) and for
the row-by-row walks (`accept(..., one_transfer=False)`, a read back per node the walk reaches), each timed
over the same steps with the device synchronised around them. Both give the same tokens (tests/test_one_transfer.py).
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from specdec.engine.accept import accept
from specdec.engine.uniforms import PositionUniforms
from specdec.engine.verify import Draws, accept_together
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

VOCAB, NODES, STEPS = 49_152, 16, 30
RULES = {"greedy": SamplingParams(), "sampled": SamplingParams(temperature=0.8, top_p=0.95),
         "drawn_chain": SamplingParams(temperature=1.0)}


def _rows(rule: str, rows: int, device: torch.device) -> tuple[list[DraftTree], list[torch.Tensor]]:
    """Each row: logits [NODES, VOCAB] and a chain along their argmax (greedy and sampled accept deep), with
    the target's own rows as draft probabilities for a drawn chain."""
    trees, logits = [], []
    for row in range(rows):
        scores = 4 * torch.randn(NODES, VOCAB, generator=torch.Generator().manual_seed(row)).to(device)
        tokens = scores.argmax(-1).tolist()
        draft = scores.softmax(-1) if rule == "drawn_chain" else None
        trees.append(DraftTree.chain(1, tokens[:-1], None if draft is None else torch.cat([draft[:1], draft[:-1]])))
        logits.append(scores)
    return trees, logits


def _time(run, device: torch.device) -> float:  # noqa: ANN001 - a step
    times = []
    for _ in range(STEPS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 3)


def _draws(params: SamplingParams, rows: int, device: torch.device) -> list[Draws]:
    """Each row's draws, seeded alike every step (both ways then walk the same paths)."""
    gens = [torch.Generator(device=device).manual_seed(row) for row in range(rows)]
    return [Draws(params, g, PositionUniforms(g, device)) for g in gens]


def _one(params: SamplingParams, trees: list[DraftTree], logits: list[torch.Tensor], device: torch.device) -> dict:
    def together() -> list:
        return accept_together(trees, logits, _draws(params, len(trees), device))

    def row_by_row() -> list:
        draws = _draws(params, len(trees), device)
        return [accept(t, x, d.sampling, d.generator, d.positions, one_transfer=False)
                for t, x, d in zip(trees, logits, draws, strict=True)]

    accepted = [len(acceptance.tokens) for acceptance in together()]
    return {"together": _time(together, device), "row_by_row": _time(row_by_row, device),
            "tokens": round(sum(accepted) / len(trees), 2)}


def acceptance_ms(device: torch.device) -> dict[str, dict[str, float]]:
    """{rule x rows: {"together": ms, "row_by_row": ms, "tokens": emitted a row}} on `device`."""
    return {f"{rule}_x{rows}": _one(params, *_rows(rule, rows, device), device)
            for rule, params in RULES.items() for rows in (1, 8)}


if __name__ == "__main__":
    print(json.dumps(acceptance_ms(torch.device("cuda" if torch.cuda.is_available() else "cpu"))))

"""How many prompt tokens a joining request prefills per decode step: sized from the measured cost curve.

Why: a prompt that joins running requests is prefilled a chunk per step
(`specdec.engine.batch.Batch`), so each of those steps costs the running
streams one chunk's pass on top of their own. A fixed chunk is right for one
machine only: on a slow CPU a 256-token chunk stretched a running stream's
largest gap about tenfold. Here the chunk is the largest whose pass, by this
machine's measured cost curve (`specdec.engine.costs`), costs at most
`MAX_GAP_RATIO - 1` one-token passes, so a joining prompt stretches a running
stream's gap to at most about MAX_GAP_RATIO times its normal gap.

But never below `MIN_PREFILL_CHUNK` = 64 tokens: a smaller chunk's pass is mostly
the weights' read, which a one-token pass pays too, so a prompt then takes
many steps to join and nearly every step carries a chunk: the running streams'
median gap grows and throughput falls, for a smaller largest gap
(docs/benchmarks.md, "A joining prompt's prefill chunk").

Invariants: the chunk is within [MIN_PREFILL_CHUNK, DEFAULT_PREFILL_CHUNK]
(never so small that a long prompt takes forever to join, never larger than
the engine's default); without a curve (no batching, nothing measured) it is
DEFAULT_PREFILL_CHUNK; it is decided once, at startup; an operator's
`--prefill-chunk` is taken as given.
"""

from __future__ import annotations

from specdec.engine.batch import DEFAULT_PREFILL_CHUNK
from specdec.engine.costs import CostModel

MAX_GAP_RATIO = 3.0  # a running stream's gap while a prompt joins, over its normal gap (a one-token pass)
MIN_PREFILL_CHUNK = 64  # below it a chunk's pass is mostly the weights' read (see the module docstring)


def sized_prefill_chunk(costs: CostModel | None, max_gap_ratio: float = MAX_GAP_RATIO) -> int:
    """The largest chunk whose pass costs at most (max_gap_ratio - 1) one-token passes, within the bounds."""
    if max_gap_ratio <= 1:
        raise ValueError(f"max_gap_ratio must be > 1, got {max_gap_ratio}")
    if costs is None:
        return DEFAULT_PREFILL_CHUNK
    budget = (max_gap_ratio - 1) * costs.cost(1)
    fitting = [n for n in range(MIN_PREFILL_CHUNK, DEFAULT_PREFILL_CHUNK + 1) if costs.cost(n) <= budget]
    return max(fitting, default=MIN_PREFILL_CHUNK)

"""What one more draft node costs in this engine's own steps, as a share of a plain step.

Why: tree planners (LogitSpec's, the heads') size a tree from the cost curve that `costs` probes
once per machine: passes of n nodes over a throwaway cache of 384 tokens, nothing else running.
A drafting step in the loop costs more per node than that: the proposal's and acceptance's work
grows with the tree, long prompts make every row's attention dearer, and right after a wide pass
the caches hold the logits, not the weights. Measured on Spec-Bench turns, a drafting step cost
a plain step's multiple well above the curve's (docs/benchmarks.md, "A node priced by the
engine's own steps"), so the planner kept nodes that did not pay.

So the engine's own steps price a node: over a row's drafting steps, the slope of a step's
seconds against its node count (a least-squares line over decayed sums: what is fixed in a
drafting step, the proposal's call and the loop, falls into the intercept, which the floor
prices), as a share of a settled plain step's seconds. The floor keeps it per row (carried to
the next row of the same method, as its rates are) and the engine hands it to a row's proposer
alone in its pass (`ProposalContext.node_price`); LogitSpec's planner and the greedy trees of
EAGLE, Medusa and Hydra then charge n nodes max(curve(n), curve(1) * (1 + price * (n - 1))):
never less than the probe says.

Invariants: no price until the steps seen spread over enough node counts (a slope from trees
of one size is noise); the price lies within [0, MAX_PRICE]; it changes no output (drafts are
verified, whatever their number).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DECAY = 0.99  # per drafting step: the line follows roughly the last hundred drafting steps
MIN_SPREAD = 1.0  # the node counts' variance (decayed) below which no slope is read
MIN_WEIGHT = 8.0  # drafting steps (decayed) before a price
MAX_PRICE = 1.0  # a node never costs more than a plain step (a slope above it is noise)


@dataclass
class NodePrice:
    """Decayed sums of drafting steps' (extra nodes, seconds), and the plain step they are priced against."""

    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0

    def add(self, nodes: int, seconds: float) -> None:
        """One drafting step of `nodes` nodes (root included) that took `seconds`, whole."""
        x = float(nodes - 1)
        self.weight = DECAY * self.weight + 1.0
        self.sum_x = DECAY * self.sum_x + x
        self.sum_y = DECAY * self.sum_y + seconds
        self.sum_xx = DECAY * self.sum_xx + x * x
        self.sum_xy = DECAY * self.sum_xy + x * seconds

    def slope(self) -> float | None:
        """Seconds a step's extra node adds, by least squares; None while the steps seen say too little."""
        if self.weight < MIN_WEIGHT:
            return None
        mean_x = self.sum_x / self.weight
        spread = self.sum_xx / self.weight - mean_x * mean_x
        if spread < MIN_SPREAD:
            return None
        return (self.sum_xy / self.weight - mean_x * self.sum_y / self.weight) / spread

    def price(self, plain_seconds: float | None) -> float | None:
        """An extra node's seconds as a share of a plain step's `plain_seconds` (None: not known yet)."""
        slope = self.slope()
        if slope is None or not plain_seconds or plain_seconds <= 0:
            return None
        return min(max(slope / plain_seconds, 0.0), MAX_PRICE)


def priced_table(table: Sequence[float], price: float | None) -> list[float]:
    """A cost table (`CostModel.table`: [0, cost(1), ..., cost(N)]) with each size charged at least
    cost(1) * (1 + price * (n - 1)); the table as it is without a price."""
    if price is None or len(table) < 2:
        return list(table)
    one = table[1]
    return [table[0], *(max(cost, one * (1.0 + price * n)) for n, cost in enumerate(table[1:]))]


class PricedCosts:
    """A proposer's cost table and its copy at the price last asked for (a price moves little a step)."""

    def __init__(self, table: Sequence[float]) -> None:
        self.table = list(table)
        self._key: float | None = None
        self._priced = self.table

    def at(self, price: float | None) -> list[float]:
        """`priced_table(table, price)`, the price taken to a hundredth; the table itself without one."""
        if price is None:
            return self.table
        key = round(price, 2)
        if key != self._key:
            self._key, self._priced = key, priced_table(self.table, key)
        return self._priced

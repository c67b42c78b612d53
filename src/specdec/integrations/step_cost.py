"""What one more verified token costs inside an engine we do not drive, measured as its steps go by.

Why: a draft token is worth proposing when its chance of being accepted beats
its price. Our own engine prices tokens with a measured cost curve
(`proposers.budget.CostModel`), but inside vLLM a proposer cannot time a pass of
its choosing, and the price moves with the batch: on two cores a decode step of
one request carries five more tokens almost for free, while at 32 requests every
token adds to the pass. What a proposer does see is every step: the wall time
between two `propose` calls is the engine's step (scheduling, the forward pass
over the scheduled tokens, sampling, verification), and it knows how many tokens
the step carried and how many it emitted. So `StepCost` fits, over recent decode
steps, the line

    seconds = base + per_token * tokens carried

and prices one more draft token as the share of a step's output its time would
have produced at the current rate:

    price = per_token * (tokens emitted per second)

A draft token with acceptance chance p pays when p > price (the `node_cost` of
`chain.choose_chain`).

Invariants: exponentially weighted sums (about `window` steps), so the price
follows the batch size and the context length; `price()` is None until
`min_steps` steps are seen with some spread in the tokens carried (the caller
then uses its configured price); the price is never negative (noise that tilts
the line downwards means tokens are free) and below `MAX_PRICE`; one
observation costs a handful of float operations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PRICE = 0.95  # a price of 1 or more would never draft: leave that to the chance estimates
MAX_STEP_SECONDS = 5.0  # a longer gap between two steps is the engine idling, not a step
MIN_SPREAD = 0.1  # variance of the tokens carried below which the slope is noise


@dataclass
class StepCost:
    """Least-squares line of step seconds against tokens carried, exponentially weighted."""

    window: float = 400.0
    min_steps: int = 30
    steps: int = 0
    _sums: list[float] = field(default_factory=lambda: [0.0] * 6)  # w, w*x, w*y, w*x*x, w*x*y, w*emitted

    def observe(self, tokens: int, seconds: float, emitted: int) -> None:
        """One decode step: `tokens` carried (drafts + one per request), `emitted` tokens, `seconds` of wall time."""
        if tokens <= 0 or not 0.0 < seconds <= MAX_STEP_SECONDS:
            return
        keep = 1.0 - 1.0 / self.window
        x, y = float(tokens), seconds
        terms = (1.0, x, y, x * x, x * y, float(emitted))
        self._sums = [keep * s + t for s, t in zip(self._sums, terms, strict=True)]
        self.steps += 1

    def per_token(self) -> float | None:
        """Seconds one more carried token adds to a step (the line's slope); None without data or spread."""
        w, sx, sy, sxx, sxy, _ = self._sums
        spread = w * sxx - sx * sx
        if self.steps < self.min_steps or spread < MIN_SPREAD * w * w:
            return None
        return max(0.0, (w * sxy - sx * sy) / spread)

    def price(self) -> float | None:
        """What one more draft token costs in expected emitted tokens; None until measured."""
        slope = self.per_token()
        w, _, sy, _, _, se = self._sums
        if slope is None or sy <= 0.0:
            return None
        return min(MAX_PRICE, slope * se / sy)

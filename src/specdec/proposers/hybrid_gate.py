"""Whether the hybrid should ask its draft model at all this step: only while asking has paid.

Why: on Qwen2.5-Coder-1.5B with its 0.5B draft, the hybrid's drafted tokens were
nearly all accepted and it still ran slower than LogitSpec alone, at about twice
a steady draft pass's seconds per drafted token (docs/benchmarks.md): each ask
costs the draft's passes, the first a catch-up over every token
emitted since the draft was last asked, and an ask whose first token the draft's
length rule refuses pays that pass for nothing. So the gate scores every ask
counterfactually, after verification:

    gain = tokens the step emitted - tokens LogitSpec's tree alone would have emitted
    cost = seconds of the draft's passes + the verification seconds its nodes added

and keeps asking a kind of step (the caller's key; the hybrid's: how many tokens
of the context's end its own text matched, 0 or 1) only while the average gain
beats the average cost at LogitSpec's own rate (its emitted tokens and seconds,
the ask's part taken out). Which rate: over all steps (`per_kind=False`, the
hybrid's default, the cautious choice), or on steps of that kind only
(`per_kind=True`: where retrieval is weak the steps an ask displaces may be the
slow ones; on the Qwen pair two thirds of LogitSpec's steps accepted nothing,
yet this valuation asked too often and lost). While closed it asks every `explore_every`-th step of the
kind anyway (doubling after a losing ask, up to `MAX_EXPLORE_EVERY`), so a
passage where the draft shines is noticed.

Invariants: wall-clock based, so the hybrid uses the gate only for greedy
decoding with the `timed` schedule, whose output does not depend on what is
drafted; every decision depends only on past steps (never on this step's
drafts); the first `MIN_ASKS` steps of a kind always ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.9  # EMA weight of the past, per ask (gain, cost) and per step (rate)
MIN_ASKS = 4  # asks of a kind before the gate judges it
EXPLORE_EVERY = 8
MAX_EXPLORE_EVERY = 256


@dataclass
class _Kind:
    """One kind of step: LogitSpec's own rate there, and the decayed gain and cost of asking."""

    tokens: float = 0.0  # decayed sums of LogitSpec's own tokens and seconds: their ratio is its rate
    seconds: float = 0.0
    gain: float = 0.0  # EMA of extra tokens per ask
    cost: float = 0.0  # EMA of seconds per ask
    asks: int = 0
    explore_every: int = EXPLORE_EVERY
    since: int = 0  # steps since the last ask

    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def pays(self, rate: float | None) -> bool:
        return self.asks < MIN_ASKS or rate is None or self.gain >= self.cost * rate


@dataclass
class AskGate:
    """Per kind of step (the caller's key), whether asking the draft has been paying."""

    # value extra tokens at LogitSpec's rate on that kind of step (False: over all steps)
    per_kind: bool = False
    kinds: dict[int, _Kind] = field(default_factory=dict)
    asks: int = 0
    skipped: int = 0  # steps the gate refused (counted for reports and tests)
    _exploring: bool = False

    def rate(self, key: int = 0) -> float | None:
        """Tokens per second LogitSpec alone emits on this kind of step, or on all (None before any)."""
        if self.per_kind:
            kind = self.kinds.get(key)
            return kind.rate() if kind else None
        seconds = sum(kind.seconds for kind in self.kinds.values())  # every kind's own decayed sums
        return sum(kind.tokens for kind in self.kinds.values()) / seconds if seconds > 0 else None

    def should_ask(self, key: int = 0) -> bool:
        """Decide for one step of this kind (then `step`, and `asked` if it asked)."""
        kind = self.kinds.setdefault(key, _Kind())
        self._exploring = False
        if kind.pays(self.rate(key)):
            return True
        kind.since += 1
        if kind.since >= kind.explore_every:
            self._exploring = True
            return True
        self.skipped += 1
        return False

    def step(self, key: int, tokens: int, seconds: float) -> None:
        """Every step (each kind, strong matches too), asked or not: what LogitSpec's own tree emitted,
        in its own seconds."""
        kind = self.kinds.setdefault(key, _Kind())
        kind.tokens = DECAY * kind.tokens + tokens
        kind.seconds = DECAY * kind.seconds + max(seconds, 0.0)

    def asked(self, key: int, gain: int, cost_s: float) -> None:
        """An ask's outcome: `gain` extra tokens emitted, `cost_s` seconds it added."""
        kind = self.kinds.setdefault(key, _Kind())
        first = kind.asks == 0
        kind.gain = gain if first else DECAY * kind.gain + (1 - DECAY) * gain
        kind.cost = cost_s if first else DECAY * kind.cost + (1 - DECAY) * cost_s
        kind.asks += 1
        kind.since = 0
        self.asks += 1
        if self._exploring:
            lost = gain < cost_s * (self.rate(key) or 0.0)
            kind.explore_every = min(kind.explore_every * 2, MAX_EXPLORE_EVERY) if lost else EXPLORE_EVERY

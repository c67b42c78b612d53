"""Whether the hybrid should ask its draft model at all this step: only while asking has paid.

Why: measured on Qwen2.5-Coder-1.5B with its 0.5B draft (bf16, 2-core CPU),
the hybrid's drafted tokens were accepted 90% of the time and it still ran at
0.90x of LogitSpec alone. Each ask costs the draft's passes, and the first of
them catches the draft up on every token emitted since it was last asked
(a prefill the draft's per-token schedule rightly does not price per token),
while LogitSpec's drafts cost nothing and already emit ~1.9 tokens per pass.
The draft's own length rule judges each token against the draft's own rate,
not against what the step would have emitted without it. So the gate scores
every ask counterfactually, after verification:

    gain = tokens the step emitted - tokens LogitSpec's tree alone would have emitted
    cost = seconds of the draft's passes + the verification seconds its nodes added

and asks again only while the average gain beats the average cost at the
method's current rate, kept apart per kind of step (the hybrid's key: how many
tokens of the context's end the request's own text matched, 0 or 1, since an
ask pays more where retrieval has less) (tokens emitted per second over all steps, asked or not):
an ask that emits fewer extra tokens than its seconds would have produced at
that rate lowers the rate. While closed it asks every `explore_every`-th
eligible step anyway (doubling after a losing ask, up to `MAX_EXPLORE_EVERY`),
so a passage where the draft shines is noticed.

Invariants: wall-clock based, so the hybrid uses the gate only for greedy
decoding with the `timed` schedule, whose output does not depend on what is
drafted; every decision depends only on past steps (never on this step's
drafts); the first `MIN_ASKS` eligible steps always ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.9  # EMA weight of the past, per ask (gain, cost) and per step (rate)
MIN_ASKS = 4  # asks before the gate judges
EXPLORE_EVERY = 8
MAX_EXPLORE_EVERY = 256


@dataclass
class _Asks:
    """One kind of step's record of asking: decayed gain and cost, and the exploring interval."""

    gain: float = 0.0  # EMA of extra tokens per ask
    cost: float = 0.0  # EMA of seconds per ask
    count: int = 0
    explore_every: int = EXPLORE_EVERY
    since: int = 0  # eligible steps since the last ask

    def add(self, gain: int, cost_s: float) -> None:
        first = self.count == 0
        self.gain = gain if first else DECAY * self.gain + (1 - DECAY) * gain
        self.cost = cost_s if first else DECAY * self.cost + (1 - DECAY) * cost_s
        self.count += 1
        self.since = 0


@dataclass
class AskGate:
    """Per kind of step (the caller's key, e.g. how much of the context's end retrieval matched), the
    running gain and cost of asking the draft; and the method's rate over all steps, decayed."""

    tokens: float = 0.0  # decayed sums of every step's emitted tokens and seconds: their ratio is the rate
    seconds: float = 0.0
    asks: int = 0
    skipped: int = 0  # eligible steps the gate refused (counted for reports and tests)
    records: dict[int, _Asks] = field(default_factory=dict)
    _exploring: bool = False

    def rate(self) -> float | None:
        """Tokens emitted per second over recent steps (None before any)."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    def pays(self, key: int = 0) -> bool:
        """Whether asking on this kind of step is expected to raise the rate: gain >= cost x rate."""
        record, rate = self.records.get(key), self.rate()
        if record is None or record.count < MIN_ASKS or rate is None:
            return True
        return record.gain >= record.cost * rate

    def should_ask(self, key: int = 0) -> bool:
        """Decide for one eligible step of this kind (then `asked` with its outcome, if asked)."""
        self._exploring = False
        if self.pays(key):
            return True
        record = self.records[key]
        record.since += 1
        if record.since >= record.explore_every:
            self._exploring = True
            return True
        self.skipped += 1
        return False

    def step(self, emitted: int, seconds: float) -> None:
        """Every step, asked or not: `emitted` tokens in `seconds` (proposal + verification)."""
        self.tokens = DECAY * self.tokens + emitted
        self.seconds = DECAY * self.seconds + max(seconds, 0.0)

    def asked(self, gain: int, cost_s: float, key: int = 0) -> None:
        """An ask's outcome: `gain` extra tokens emitted, `cost_s` seconds it added."""
        self.asks += 1
        record = self.records.setdefault(key, _Asks())
        record.add(gain, cost_s)
        if self._exploring:
            lost = gain < cost_s * (self.rate() or 0.0)
            record.explore_every = min(record.explore_every * 2, MAX_EXPLORE_EVERY) if lost else EXPLORE_EVERY

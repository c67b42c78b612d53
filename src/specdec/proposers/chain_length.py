"""How many tokens a draft model should guess per step (`draft` and `layerskip`).

Why: every drafted token costs one draft pass and one more row in the target's
verification pass, and pays off only if the target accepts it and every token
before it. On a CPU the second cost is not small (a fp32 matmul over a few
rows costs several times a one-row one here), so a fixed length is either
timid or wasteful. The schedules:

- not adaptive: exactly `k` drafts per step;
- `heuristic`: transformers' rule, +2 after a fully accepted chain, -1
  otherwise (between 1 and `max_k`);
- `cost`: keep drafting token i while its calibrated chain probability P_i
  (the product of the draft's own probabilities of its tokens, times a factor
  that maps the draft's confidence to the acceptance actually observed) pays
  for its marginal cost: P_i >= marginal cost x E (the draft's probabilities
  here are each row's largest one, so the decision never depends on the value
  of the token it admits: see `draft.py`), where E is the running
  number of tokens emitted per unit of cost. A token worth less than the current
  average lowers the average, so the chain stops there. Costs come from a fixed
  model in units of a one-token target pass (`cost_per_token`: the draft pass
  plus one verified token), so the lengths depend only on the draft's outputs
  and the acceptance history: seeded sampling is reproducible;
- `timed` (the default): the same rule with costs measured on this machine
  while decoding: seconds per draft pass (EMA) and the verification pass's
  seconds as a function of the tree size (decayed least squares, slope = the
  cost of one more verified token). The per-pass seconds come from steady
  passes only (`PassTimes`: a catch-up pass over skipped tokens is a prefill,
  not the price of a drafted token), and the rate in the bar is never below
  plain decoding's (a draft that is slowing decoding down must not lower its
  own bar). Wall-clock timings make the lengths
  non-reproducible, so `timed` applies to greedy decoding only (whose output
  does not depend on the lengths: it is the target's argmax chain either way);
  with sampling it behaves as `cost`.

When not even a certain token would pay (threshold >= 1) nothing is drafted
and the draft pass is skipped too; every `EXPLORE_EVERY`-th such step drafts
one token anyway, so a change (less load, a better-matched passage) is noticed.
The same holds after `IDLE_STEPS` steps in a row whose draft pass ran but whose
first token was refused by the stop rule. The calibration (observed over
predicted acceptance) used to be learned only from steps that draft, so a draft
that was once over-confident (calibration at its floor) stayed refused for good,
paying a draft pass per step for nothing. Now a refused first token is also
scored against the target's emitted token when decoding greedily
(`learn_refused`: the pass ran, the check is free; a pass whose refused token
was right is not idle, so a draft that turned good keeps teaching), and the
exploring token covers sampling.
An exploring token that is rejected doubles that interval (up to
`MAX_EXPLORE_EVERY`), an accepted one resets it: exploring costs a catch-up
pass of the draft over every token it skipped, which on a draft that never
pays (e.g. a layer-skipping view of a 135M model) cost a noticeable share of
the run when paid every 16 steps.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("timed", "cost", "heuristic")
EMA_DECAY = 0.9
FIT_DECAY = 0.95
EXPLORE_EVERY = 16
MAX_EXPLORE_EVERY = 512
IDLE_STEPS = 2  # draft passes in a row that drafted nothing: then skip the pass, explore
MIN_SIZE_VARIANCE = 0.25  # below this the tree sizes barely vary: the slope comes from the prior


@dataclass(frozen=True)
class ChainSettings:
    k: int = 4  # fixed length, or the heuristic's starting length
    max_k: int = 12
    adaptive: bool = True
    schedule: str = "timed"
    cost_per_token: float = 0.5  # draft pass + one verified token, in one-token target passes
    verify_cost: float = 0.1  # one more verified token, same unit (the prior of the timed fit)

    def __post_init__(self) -> None:
        if self.k < 1 or self.max_k < self.k:
            raise ValueError(f"need 1 <= k <= max_k (got k={self.k}, max_k={self.max_k})")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} (got {self.schedule!r})")
        if not self.cost_per_token > 0 or self.verify_cost < 0:
            raise ValueError("cost_per_token must be > 0 and verify_cost >= 0")


@dataclass
class PassTimes:
    """A step's steady-state draft passes: the one-token passes of its chain, and the first pass
    when it fed no more than a drafting step adds (accepted tokens + the root).

    Why: after skipped steps the first pass catches the draft up on every token it
    skipped; that pass is a prefill, and timed as a per-token cost it made drafting
    look several times dearer than it is. Each exploring step added one such sample,
    so the schedule never drafted again (on the Qwen pair, whole runs barely drafted).
    """

    seconds: float = 0.0
    count: int = 0

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.count += 1


class VerifyFit:
    """Verification seconds ~ base + per_token x tree size, by decayed least squares."""

    def __init__(self, prior_slope: float) -> None:
        self.prior_slope = prior_slope  # per-token cost relative to a one-token pass
        self.sums = [0.0] * 5  # weights, sizes, sizes^2, seconds, sizes x seconds

    def add(self, size: int, seconds: float) -> None:
        values = (1.0, size, size * size, seconds, size * seconds)
        self.sums = [FIT_DECAY * s + v for s, v in zip(self.sums, values, strict=True)]

    def per_token(self) -> float | None:
        weight, sizes, squares, seconds, cross = self.sums
        if weight == 0:
            return None
        mean_size, mean_seconds = sizes / weight, seconds / weight
        variance = squares / weight - mean_size**2
        if variance < MIN_SIZE_VARIANCE:
            return self.prior_slope * mean_seconds / (1 + self.prior_slope * (mean_size - 1))
        return max((cross / weight - mean_size * mean_seconds) / variance, 0.0)


class DraftLength:
    """Per step a cap (`begin_step`), per token a stop rule (`keep_going`), then `update`."""

    def __init__(self, settings: ChainSettings) -> None:
        self.settings = settings
        self.k = settings.k
        self.rate_units: float | None = None  # EMA of tokens per unit of modelled cost
        self.rate_seconds: float | None = None  # EMA of tokens per second
        self.plain_rate: float | None = None  # EMA of tokens per second of steps without a draft pass
        self.rate_floor: float | None = None  # tokens per second the caller reaches without this draft (hybrid)
        self.pass_seconds: float | None = None  # EMA of seconds per draft pass
        self.fit = VerifyFit(settings.verify_cost)
        self.observed = 1.0  # EMA of accepted tokens per step
        self.predicted = 1.0  # EMA of summed chain probabilities per step
        self.timed = False
        self.exploring = False
        self.num_skipped = 0
        self.num_idle = 0  # steps in a row whose draft pass drafted nothing
        self.refused_right = False  # this step's refused first token was what the target emitted
        self.explore_every = EXPLORE_EVERY

    @property
    def uses_confidence(self) -> bool:
        return self.settings.adaptive and self.settings.schedule in ("cost", "timed")

    def threshold(self) -> float:
        """The calibrated chain probability a drafted token needs (marginal cost x current rate)."""
        per_token = self.fit.per_token()
        if self.timed and self.pass_seconds is not None and per_token is not None and self.rate_seconds:
            # never below plain decoding's rate (a draft that lowers the rate must not lower its own bar),
            # nor below the rate of the method the draft serves in (the hybrid: LogitSpec's steps too)
            rate = max(self.rate_seconds, self.plain_rate or 0.0, self.rate_floor or 0.0)
            return (self.pass_seconds + per_token) * rate
        return self.settings.cost_per_token * (self.rate_units or 1.0)

    def begin_step(self, greedy: bool) -> int:
        """The most drafts this step (0: draft nothing, skip the draft pass)."""
        self.timed = greedy and self.settings.schedule == "timed"
        self.exploring = False
        if not self.uses_confidence:
            return self.k
        if self.threshold() < 1.0 and self.num_idle < IDLE_STEPS:
            return self.settings.max_k
        self.num_skipped += 1
        if self.num_skipped >= self.explore_every:
            self.num_skipped = 0
            self.exploring = True
            return 1
        return 0

    def keep_going(self, chain_prob: float) -> bool:
        if not self.uses_confidence or self.exploring:
            return True
        calibration = min(max(self.observed / max(self.predicted, 1e-6), 0.2), 5.0)
        return min(1.0, calibration * chain_prob) >= self.threshold()

    def update(
        self,
        num_drafted: int,
        num_accepted: int,
        predicted: float,
        draft_s: float,
        num_passes: int,
        verify_s: float,
        tree_size: int = 0,
        steady: PassTimes | None = None,
    ) -> None:
        """After verification: the step's drafts, acceptance, summed chain probability and timings.

        `tree_size` is the verified tree's node count when the chain shared it with other
        branches (0: the chain and its root alone), so the verification fit sees the real size.
        `steady`: the step's passes that price one more drafted token (None: every pass,
        draft_s / num_passes); a step without such a pass leaves the per-pass cost as it was.
        """
        if not self.settings.adaptive:
            return
        if self.settings.schedule == "heuristic":
            if num_drafted:
                grown = self.k + 2 if num_accepted == num_drafted else self.k - 1
                self.k = min(max(grown, 1), self.settings.max_k)
            return
        if num_passes and not num_drafted and not self.refused_right:
            self.num_idle += 1
        elif num_passes:
            self.num_idle = 0
        self.refused_right = False
        if self.exploring and num_drafted:
            grown = self.explore_every * 2 if num_accepted == 0 else EXPLORE_EVERY
            self.explore_every = min(grown, MAX_EXPLORE_EVERY)
        emitted = num_accepted + 1
        self.rate_units = _ema(self.rate_units, emitted / (1 + self.settings.cost_per_token * num_drafted))
        self.rate_seconds = _ema(self.rate_seconds, emitted / max(draft_s + verify_s, 1e-9))
        if not num_passes:
            self.plain_rate = _ema(self.plain_rate, 1 / max(verify_s, 1e-9))
        if steady is None and num_passes:
            self.pass_seconds = _ema(self.pass_seconds, draft_s / num_passes)
        elif steady is not None and steady.count:
            self.pass_seconds = _ema(self.pass_seconds, steady.seconds / steady.count)
        self.fit.add(tree_size or num_drafted + 1, verify_s)
        if num_drafted:
            self.observed = _ema(self.observed, num_accepted)
            self.predicted = _ema(self.predicted, predicted)


    def learn_refused(self, chain_prob: float, accepted: bool) -> None:
        """A first token the stop rule refused, scored against what the target emitted (greedy only).

        The draft pass ran anyway, so its refused token costs nothing to check: learning
        from it keeps the calibration honest while nothing is drafted.
        """
        if self.uses_confidence:
            self.observed = _ema(self.observed, float(accepted))
            self.predicted = _ema(self.predicted, chain_prob)
            self.refused_right = accepted  # a pass that is teaching the calibration is not idle


def _ema(current: float | None, value: float) -> float:
    return value if current is None else EMA_DECAY * current + (1 - EMA_DECAY) * value

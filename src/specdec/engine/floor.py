"""The floor under every method: a row drafts only while its drafting steps out-earn plain steps.

Why: a draft pays when the tokens it adds are worth more than what proposing, the wider
pass, acceptance and the commit cost. The cost curve and the acceptance rates size a tree
from a probe and a model of the text; what the user gets is the outcome, and on a fast pass
the fixed work around it made whole methods slower than plain decoding. So the floor
prices every method by one rule, measured as it decodes: tokens per second of the row's
drafting steps against tokens per second of its plain steps, each step timed whole
(proposal, pass, acceptance, commit). While drafting loses, the row's steps are plain:
the proposer is asked for depth 0 (it keeps its state and drafts nothing). Now and then
the losing mode is tried, so the floor follows the text: plain steps keep the plain rate
current, drafting steps see whether the text has become predictable. A drafting try is a run
of `DRAFT_RUN` steps judged whole: what one drafting step emits varies from one token to
several, and judged on single steps the floor kept plain steps where drafting paid
(docs/benchmarks.md). The try comes less often each time the loser loses again (`EXPLORE`);
once it has lost at the widest of those gaps, never more often than keeps what its tries
lose under `TRY_SHARE` of the leader's time: a method whose drafting step costs several
plain steps (EAGLE's head on a fast pass) is then tried rarely, a cheap loser as before.

A drafting step can also slow the plain steps right after it (on some CPUs a one-node pass is
much dearer right after a wide pass than among one-node passes: docs/benchmarks.md), so a plain
step right after drafting would price plain decoding by drafting's aftermath. The plain rate is
the *settled* one: only plain steps more than `SETTLE` steps after the last drafting step count
towards it, and what the unsettled ones cost beyond the settled rate (or save) is charged to
drafting, which caused it. A try of plain steps while drafting leads is therefore a run of
`SETTLE` + 1 steps, judged and priced at its last, and the first comes `PLAIN_TRY_GAP` steps after
drafting takes the lead (the tries then take the share of the steps one-step tries did).

A plain step need not be blind: it tells the proposer how deep a lookup alone may draft
(`ProposalContext.lookup_depth`), and LogitSpec then verifies the continuation of the context's end where it
matched earlier and pays, nothing else. Such a step counts as a plain one (the plain mode is "plain
steps and their lookups"); a node is priced against settled plain steps of the root alone.

What a method learned carries to its next request: `Floor` keeps each proposer type's
rates, and a new row starts from them; with a store (`specdec.engine.floor_store`) also to the next
process (the API's calls, the CLI's runs), which starts from them a little warier (`resumed`).

Invariants:
- only rows whose output no tree can change are gated: greedy rows, and sampled rows of a
  proposer whose trees never carry draft probabilities (`deterministic_drafts`: each output
  token is then the inverse CDF of the target's distribution at its position's uniform,
  `engine.uniforms`, whatever was drafted); any other sampled row always drafts, so a seeded
  output never depends on timing (a tree drawn with draft probabilities takes the row's
  random draws). Greedy and sampled rows of a method learn their rates apart;
- a gated step is an ordinary step whose tree is the root alone or a looked-up chain: exactness is the
  verifier's;
- only a pass with one decoding row is gated: with several rows in a pass, the batch's node
  budget (`specdec.engine.planner`) spends the rows;
- a gated row's pass captures the target's features only where its next step may draft
  (`may_draft_next`): a head's plain steps then cost a plain step's pass (EAGLE-3's captured pass
  runs its layers in four stretches, ~10% dearer on a Xeon).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from specdec.engine.node_price import NodePrice

DECAY = 0.97  # per row step: a mode's rate follows roughly its steps among the last thirty
MARGIN = 1.05  # the mode that trails must earn 5% more tokens per second to take the lead
EXPLORE = (4, 64)  # steps between tries of the losing mode: the first gap, doubled per loss up to the last
TRY_SHARE = 0.02  # what a losing mode's tries may cost, as a share of the leader's time ...
TRY_GAP_MAX = 2048  # ... with a gap of at most this many steps
WARMUP = 3  # drafting steps a new method takes before its first plain step
SETTLE = 3  # plain steps after a drafting step that pay for it: the next one is a settled plain step
PLAIN_TRY_GAP = EXPLORE[0] * (SETTLE + 1)  # the first gap before a plain try (a run): the same share as EXPLORE's
DRAFT_RUN = 4  # drafting steps a try of drafting takes while plain steps lead, judged at its last


@dataclass
class _Rate:
    """Tokens and seconds of one mode's steps, each weighted by DECAY per row step since it ran."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0

    def age(self) -> None:
        self.tokens *= DECAY
        self.seconds *= DECAY
        self.steps *= DECAY

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1

    @property
    def value(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def excess(self, tokens: int, seconds: float) -> float:
        """The seconds a step took beyond this mode's for the same tokens (negative: fewer); 0 with no rate."""
        return seconds - tokens * self.seconds / self.tokens if self.tokens else 0.0

    def lost_by(self, tokens: int, seconds: float) -> float:
        """How many of this mode's steps the other mode's step lost against it: its seconds beyond what
        this mode takes for the same tokens, over this mode's seconds a step."""
        if not self.steps or not self.tokens:
            return 0.0
        return max(0.0, seconds - tokens * self.seconds / self.tokens) / (self.seconds / self.steps)


@dataclass
class FloorState:
    """One row's choice between drafting and plain steps (see the module docstring)."""

    drafting: _Rate = field(default_factory=_Rate)
    plain: _Rate = field(default_factory=_Rate)
    leader: bool | None = None  # the mode that leads (True: drafting); None until both have run
    gap: int = EXPLORE[0]  # steps between tries of the other mode
    since: int = 0  # steps since the other mode last ran
    drafted_steps: int = 0
    plain_run: int = SETTLE + 1  # plain steps since the last drafting step (settled beyond SETTLE)
    draft_run: int = 0  # drafting steps since the last plain step
    run_tokens: int = 0  # what the drafting try under way has emitted ...
    run_seconds: float = 0.0  # ... and taken
    prices: NodePrice = field(default_factory=NodePrice)  # drafting steps' seconds against their node counts
    # settled plain steps of the root alone: what a node is priced against (a plain step may verify a
    # looked-up chain, `ProposalContext.lookup_depth`: it counts towards the plain rate, not this)
    single: _Rate = field(default_factory=_Rate)

    def drafts(self) -> bool:
        """Whether the next step drafts."""
        if self.drafting.value is None or (self.plain.value is None and self.drafted_steps < WARMUP):
            return True
        if self.leader is None:
            return False
        if self.leader and 0 < self.plain_run <= SETTLE:  # a plain try goes on until a step of it is settled
            return False
        if self.leader is False and 0 < self.draft_run < DRAFT_RUN:  # a drafting try goes on to its last step
            return True
        return (not self.leader) if self.since >= self.gap else self.leader

    def may_draft_next(self, drafting: bool) -> bool:
        """Whether the step after this one may draft (this one drafting or not): its proposer then needs this
        step's pass to capture the target's features. False only while plain steps lead and the next try is
        more than a step away; a lead that turns on this step's observation is the one case it misses (the
        next step then finds no features: a head proposes the root alone, as a plain step)."""
        if drafting or self.leader is None or self.leader:
            return True
        return self.since + 1 >= self.gap

    def node_price(self) -> float | None:
        """What an extra draft node adds to a step, as a share of a settled plain step (`node_price`)."""
        return self.prices.price(self.single.seconds / self.single.steps if self.single.steps else None)

    def observe(self, drafted: bool, tokens: int, seconds: float, nodes: int = 1) -> None:
        """One finished step: which mode ran, the tokens it emitted, the seconds it took, its tree's nodes."""
        if drafted:
            self.prices.add(nodes, seconds)
        self.drafting.age()  # by row steps, not by the mode's own: a mode tried after a long gap is
        self.plain.age()  # judged on what its try shows now, not on what it showed long ago
        self.single.age()
        self.plain_run = 0 if drafted else self.plain_run + 1
        self.draft_run = self.draft_run + 1 if drafted else 0
        if drafted:
            self.drafting.add(tokens, seconds)
            self.drafted_steps += 1
            if self.leader is False:  # a drafting try: judged on the whole run at its last step
                if self.draft_run == 1:
                    self.run_tokens, self.run_seconds = 0, 0.0
                self.run_tokens += tokens
                self.run_seconds += seconds
                if self.draft_run < DRAFT_RUN:
                    return
                tokens, seconds = self.run_tokens, self.run_seconds
        elif self.plain_run > SETTLE:
            self.plain.add(tokens, seconds)
            if nodes == 1:
                self.single.add(tokens, seconds)
        else:  # a step that pays for the drafting step before it: its excess is drafting's (a saving at most
            # halves drafting's seconds, so its rate stays finite)
            charged = self.drafting.seconds + self.plain.excess(tokens, seconds)
            self.drafting.seconds = max(charged, 0.5 * self.drafting.seconds)
            if self.leader:  # the plain try goes on (`drafts`): it is judged at its settled step
                return
        before, self.leader = self.leader, self._leader()
        if self.leader is None:
            return
        if before != self.leader:  # a new leader (or the first): try the other after the shortest gap
            self.since, self.gap = 0, PLAIN_TRY_GAP if self.leader else EXPLORE[0]
        elif drafted == self.leader:
            self.since += 1
        else:  # the other mode ran and lost again: its next try comes later, the later the more it lost
            self.since, self.gap = 0, max(min(EXPLORE[1], 2 * self.gap), self._priced_gap(tokens, seconds))

    def _priced_gap(self, tokens: int, seconds: float) -> int:
        """The gap that keeps a try that lost like this one under TRY_SHARE of the time; 0 until the loser
        has lost at the widest doubled gap (a method's first steps carry one-off costs, and the text may
        turn: the doubling schedule runs first)."""
        if self.gap < EXPLORE[1]:
            return 0
        leader = self.drafting if self.leader else self.plain
        steps = SETTLE + 1 if self.leader else 1  # a plain try is a run judged at its settled step; a
        # drafting try's tokens and seconds are its whole run's
        return min(TRY_GAP_MAX, math.ceil(steps * leader.lost_by(tokens, seconds) / TRY_SHARE))

    def _leader(self) -> bool | None:
        draft_rate, plain_rate = self.drafting.value, self.plain.value
        if draft_rate is None or plain_rate is None:
            return None
        if self.leader is None:  # a tie goes to plain steps: drafting must earn its keep
            return draft_rate > plain_rate
        if self.leader:  # the lead changes hands only on a clear margin: one noisy step does not flip it
            return plain_rate <= MARGIN * draft_rate
        return draft_rate > MARGIN * plain_rate


def resumed(state: FloorState) -> FloorState:
    """A state learned in an earlier process, to start a row of this one: its rates and leader as they
    were, no run under way, and the losing mode tried within `EXPLORE[1]` steps (the machine's load, or
    the text, may have changed since)."""
    return dataclasses.replace(state, gap=min(state.gap, EXPLORE[1]), since=0, plain_run=SETTLE + 1, draft_run=0,
                               run_tokens=0, run_seconds=0.0)


class Store(Protocol):
    """Where a floor keeps what it learned between processes (`specdec.engine.floor_store.FloorStore`)."""

    def read(self) -> dict[tuple[str, bool], FloorState]: ...

    def write(self, learned: dict[tuple[str, bool], FloorState]) -> None: ...


class Floor:
    """The engine's floor: per-row states, and what each proposer type learned in earlier rows.

    price(nodes, seconds) -> the seconds a step is charged: by default the seconds it took; a
    fixed function of the tree size makes the choice independent of the machine's load
    (tests). store: where the learned states outlive the process (read once here, written as rows
    finish); None keeps them in this object only.
    """

    def __init__(self, price: Callable[[int, float], float] | None = None, store: Store | None = None) -> None:
        self.price = price or (lambda nodes, seconds: seconds)
        self.store = store
        # by the proposer's class name and sampling kind: a name, so that a store can hold it
        self._learned: dict[tuple[str, bool], FloorState] = {} if store is None else store.read()

    def start(self, proposer: object, greedy: bool = True) -> FloorState:
        """A new row's state: its proposer type's rates so far, greedy or sampled apart (a copy), or a fresh one."""
        learned = self._learned.get((proposer_name(proposer), greedy))
        return FloorState() if learned is None else copy.deepcopy(learned)

    def finish(self, proposer: object, state: FloorState, greedy: bool = True) -> None:
        """Keep a finished row's rates for the next row of its proposer type (and sampling kind)."""
        if state.drafting.value is not None:
            self._learned[proposer_name(proposer), greedy] = state
            if self.store is not None:
                self.store.write(self._learned)


def proposer_name(proposer: object) -> str:
    """What a proposer's learned state is kept under: its class's module and name."""
    kind = type(proposer)
    return f"{kind.__module__}.{kind.__qualname__}"

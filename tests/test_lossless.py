"""The lossless matrix: every method's output is plain decoding's (fp32, the real default model).

Why one matrix: "token-identical to plain" is the contract of every method, so it is
checked in one place, methods x Spec-Bench prompts, greedy and seeded sampling, against
plain outputs computed once per session (`plain_runs` in conftest.py). Seeded sampling
gives plain sampling's very tokens only for drafts without probabilities (retrieval,
lookup, Token Recycling, lookahead): their engine draws the t-th token with the t-th
uniform of the generator; methods that draft with probabilities are checked for
sampling by their distribution tests instead.

A method's default settings run on every category (`ALL`); its variants (other options, the same
code with other sizes) and its sampled cases on three (`SOME`: short and long prompts, prose and
numbers). A sampled case of a method that learns across requests (recycle tables, session stores)
serves its rows twice, so the second round drafts from state the first changed; one that starts
each request afresh serves them once, the two samplings alternating.

A case is one proposer serving its rows in order, as a server would: state it keeps
across requests (recycle tables, session stores, adaptive budgets) carries from row to
row, and a row repeated later runs on state the earlier ones changed. Each row is a
test; a row needs the rows before it, so it runs them first when selected alone. The
first row of one case per method is in the fast tier, the rest are marked `slow`. At the end, one
case per method serves eight prompts in one batch (`test_a_batch_of_eight_rows_each_equal_plain`).
`test_the_case_exercised_its_path` checks, after all of a case's rows, that drafts were
made and accepted (a matrix that never drafted would pass vacuously).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import SKIP
from helpers import fresh_logitspec as fresh_sources_logitspec
from helpers import fresh_recycle as fresh_recycle_proposer

from specdec.engine.costs import load_or_measure
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import generate_batch
from specdec.proposers import parse_method
from specdec.proposers.draft import DraftConfig
from specdec.proposers.hybrid import HybridConfig, HybridProposer
from specdec.proposers.layerskip import LayerSkipConfig
from specdec.proposers.plain import PlainProposer
from specdec.proposers.recycle import RecycleConfig
from specdec.proposers.session_store import SessionConfig, SessionProposer, SessionStore
from specdec.proposers.universal import UniversalDraftProposer
from specdec.sampling import SamplingParams

GREEDY = SamplingParams()
SAMPLINGS = (SamplingParams(temperature=0.7, seed=11), SamplingParams(temperature=1.0, top_p=0.9, seed=12))
HOT = SamplingParams(temperature=0.9, seed=3)
# Short prompts first: a case's first row is its cheapest (the fast tier's).
ALL = ("translation", "mt_bench", "qa", "math_reasoning", "summarization", "rag")
SOME = ("mt_bench", "summarization", "math_reasoning")  # short and long prompts, prose and numbers


@dataclass(frozen=True)
class Case:
    """A proposer (built from the session's fixtures) and the (category, sampling) rows it serves in order."""

    name: str
    build: Callable[[pytest.FixtureRequest], Any]
    rows: tuple[tuple[str, SamplingParams], ...]
    new_tokens: int = 32
    fast: bool = False  # its first row is in the fast tier
    ran: Callable[[Any, list], bool] | None = None  # over the proposer and all rows' outputs: the path ran


def greedy(*categories: str) -> tuple[tuple[str, SamplingParams], ...]:
    return tuple((category, GREEDY) for category in categories)


def sampled(categories: tuple[str, ...], samplings: tuple[SamplingParams, ...], rounds: int = 2):
    """`rounds` passes over the categories, each category's sampling shifting by one a pass: with two
    samplings and two rounds every (category, sampling) pair runs once, and the second round drafts
    from state the first one changed (with one sampling a round repeats the first)."""
    return tuple((c, samplings[(i + r) % len(samplings)]) for r in range(rounds) for i, c in enumerate(categories))


def method(spec: str) -> Callable[[pytest.FixtureRequest], Any]:
    """A method string built as served: on the model's shared parts (recycle table, session store)."""
    return lambda request: parse_method(spec).build(request.getfixturevalue("default_model"))


def with_store(spec: str) -> Callable[[pytest.FixtureRequest], Any]:
    """A method string whose `{store}` is the session's datastore folder."""
    return lambda request: method(spec.format(store=request.getfixturevalue("stdlib_datastore")))(request)


def fresh_logitspec(option: str) -> Callable[[pytest.FixtureRequest], Any]:
    """LogitSpec on its own new recycle table and session store (not the model's shared ones), fixed costs."""
    return lambda request: fresh_sources_logitspec(
        request.getfixturevalue("default_model"),
        f"logitspec:{option}".format(store=request.getfixturevalue("stdlib_datastore")),
    )


def fresh_recycle(config: RecycleConfig) -> Callable[[pytest.FixtureRequest], Any]:
    return lambda request: fresh_recycle_proposer(request.getfixturevalue("default_model"), config)


def small_draft(**options) -> Callable[[pytest.FixtureRequest], Any]:
    """`draft` with the 24-layer stand-in draft (conftest's `small_draft`: accepted about half the time)."""
    return lambda request: DraftConfig(**options).build_with(
        request.getfixturevalue("default_model"), request.getfixturevalue("small_draft")
    )


def hybrid(**options) -> Callable[[pytest.FixtureRequest], Any]:
    """The hybrid over the stand-in draft (`heuristic` lengths: the cost rules rightly find that a draft
    this large never pays, and would draft nothing)."""

    def build(request):
        loaded = request.getfixturevalue("default_model")
        config = HybridConfig(draft_model="in-memory", schedule="heuristic", **options)
        draft = config.draft_config().build_with(loaded, request.getfixturevalue("small_draft"))
        return HybridProposer(config, config.logitspec_config().build(loaded), draft, loaded.model.config.vocab_size)

    return build


def self_draft_through_text(request):
    loaded = request.getfixturevalue("default_model")
    proposer = DraftConfig(draft_model="self", k=4, adaptive=False, text="always").build_loaded(loaded, loaded)
    assert isinstance(proposer, UniversalDraftProposer)
    return proposer


# The path ran: what each former per-file identity loop also asserted.
def accepted(_, outs) -> bool:
    return sum(step.num_accepted for out in outs for step in out.stats.steps) > 0


def drafted(_, outs) -> bool:
    return sum(step.tree_size > 1 for out in outs for step in out.stats.steps) > 0


def mat_above_one(_, outs) -> bool:
    return max(out.stats.mat for out in outs) > 1.0


def fewer_passes(_, outs) -> bool:
    return all(out.stats.num_forward_passes < len(out.token_ids) for out in outs)


def offered(source: str) -> Callable[[Any, list], bool]:
    return lambda proposer, _: proposer.source_stats[source]["offered"] > 0


def session_offered_and_accepted(proposer, _) -> bool:
    return proposer.source_stats["session"]["offered"] > 0 and proposer.source_stats["session"]["accepted"] > 0


def hybrid_draft_accepted_sometimes(proposer, _) -> bool:
    draft = proposer.source_stats["draft"]
    return draft["offered"] > 0 and 0 < draft["accepted"] < draft["offered"]


def repeats_draft_from_the_store(_, outs) -> bool:
    """Rows come in pairs, one prompt twice: the second is drafted from the store the first one filled."""
    return all(again.stats.mat > first.stats.mat for first, again in zip(outs[::2], outs[1::2], strict=True))


def lookahead_within_budget(proposer, outs) -> bool:
    steps = [step for out in outs for step in out.stats.steps]
    tokens = sum(out.stats.num_new_tokens for out in outs)
    passes = sum(out.stats.num_forward_passes for out in outs)
    return max(step.tree_size for step in steps) <= 10 and bool(proposer.pool) and tokens > passes


CASES = (
    # prompt lookup and LogitSpec (formerly tests/test_retrieval.py, test_sampled_identity.py)
    Case("pld", method("pld"), greedy(*ALL), fast=True, ran=mat_above_one),
    Case("logitspec", method("logitspec"), greedy(*ALL), fast=True, ran=mat_above_one),
    Case("logitspec:adaptive=false,budget=24", method("logitspec:adaptive=false,budget=24"), greedy(*SOME),
         ran=mat_above_one),
    Case("logitspec:third=true,floor=false", method("logitspec:third=true,floor=false"), greedy(*SOME),
         ran=mat_above_one),
    Case("pld-sampled", method("pld"), sampled(SOME, SAMPLINGS, rounds=1), 24, fast=True, ran=accepted),
    Case("logitspec-sampled", method("logitspec"), sampled(SOME, SAMPLINGS), 24, fast=True, ran=accepted),
    Case("logitspec:session=true,third=true-sampled", method("logitspec:session=true,third=true"),
         sampled(SOME, SAMPLINGS), 24, ran=accepted),
    Case("logitspec:adaptive=false-sampled", method("logitspec:adaptive=false"), sampled(SOME, SAMPLINGS), 24,
         ran=accepted),
    # LogitSpec's other sources, each on a fresh table or store (formerly tests/test_logitspec_sources.py)
    Case("logitspec:recycle=true", fresh_logitspec("recycle=true"), greedy(*SOME), ran=offered("recycle")),
    Case("logitspec:session=true", fresh_logitspec("session=true"), greedy(*ALL, ALL[0]),
         ran=session_offered_and_accepted),
    Case("logitspec:datastore", fresh_logitspec("datastore={store}"), greedy(*ALL), ran=offered("datastore")),
    Case("logitspec:recycle-sampled", fresh_logitspec(""), sampled(SOME, (HOT,)), 24, ran=offered("recycle")),
    # Token Recycling (formerly tests/test_recycle.py, test_sampled_identity.py)
    Case("recycle:budget=16", fresh_recycle(RecycleConfig(budget=16)), greedy(*ALL), fast=True, ran=accepted),
    Case("recycle:k=4,budget=8,max_depth=3", fresh_recycle(RecycleConfig(k=4, budget=8, max_depth=3)),
         greedy(*SOME)),
    Case("recycle-sampled", method("recycle"), sampled(SOME, SAMPLINGS), 24, fast=True, ran=accepted),
    # lookahead (formerly tests/test_lookahead.py, test_sampled_identity.py)
    Case("lookahead:window=4,ngram=3,guesses=2,max_nodes=10",
         method("lookahead:window=4,ngram=3,guesses=2,max_nodes=10"), greedy("mt_bench", "math_reasoning", "counting"),
         fast=True, ran=lookahead_within_budget),
    Case("lookahead-sampled", method("lookahead"), sampled(SOME, SAMPLINGS, rounds=1), 24, fast=True, ran=accepted),
    # REST's datastore (formerly tests/test_datastore.py)
    Case("datastore", with_store("datastore:path={store}"), greedy(*ALL), fast=True, ran=drafted),
    Case("datastore:max_branches=3,budget=12,min_ngram=1",
         with_store("datastore:path={store},max_branches=3,budget=12,min_ngram=1"), greedy(*SOME), ran=drafted),
    Case("datastore-sampled", with_store("datastore:path={store},min_ngram=1"), sampled(("translation",), (HOT,)),
         24, fast=True),
    # the session store, each prompt twice (formerly tests/test_session_store.py)
    Case("session", lambda request: SessionProposer(SessionConfig(), SessionStore(),
                                                    request.getfixturevalue("default_model").eos_token_ids),
         greedy("mt_bench", "mt_bench", "qa", "qa", "math_reasoning", "math_reasoning"), fast=True,
         ran=repeats_draft_from_the_store),
    Case("session-sampled", method("session"), sampled(("mt_bench", "mt_bench"), (HOT,), rounds=1), 24,
         fast=True),
    # a draft model (formerly tests/test_draft.py, test_draft_fill.py, test_draft_jump.py)
    Case("draft:k=3,adaptive=false", small_draft(k=3, adaptive=False), greedy("mt_bench"), fast=True,
         ran=fewer_passes),
    Case("draft:k=2,schedule=heuristic", small_draft(k=2, schedule="heuristic"), greedy("summarization"),
         ran=fewer_passes),
    Case("draft:schedule=cost,cost_ratio=0.3", small_draft(schedule="cost", cost_ratio=0.3),
         greedy("math_reasoning"), ran=fewer_passes),
    Case("draft:schedule=timed", small_draft(schedule="timed"), greedy("mt_bench")),  # may find drafting not pay
    Case("draft:fill=6,k=3,adaptive=false", small_draft(fill=6, k=3, adaptive=False), greedy(*SOME),
         ran=lambda proposer, _: proposer.num_leaves_accepted > 0),
    Case("draft:fill=6,jump=2", small_draft(fill=6, jump=2), greedy(*SOME),
         ran=lambda proposer, _: proposer.num_leaves_accepted > 0),
    Case("draft:jump=1,k=3,adaptive=false", small_draft(jump=1, k=3, adaptive=False), greedy(*SOME),
         ran=lambda proposer, _: proposer.jump.saved > 0),
    Case("draft:jump=2", small_draft(jump=2), greedy(*SOME), ran=lambda proposer, _: proposer.jump.saved > 0),
    # universal assisted generation: the model drafting for itself through text (formerly tests/test_hybrid.py)
    Case("draft:self,text=always", self_draft_through_text, greedy(*SOME, "rag"), 40,
         ran=lambda _, outs: all(out.stats.mat > 2.0 for out in outs)),
    # the hybrid: LogitSpec's tree plus the draft's chain (formerly tests/test_hybrid.py)
    Case("hybrid:when=weak", hybrid(when="weak"), greedy(*SOME, "rag"), 40, fast=True,
         ran=hybrid_draft_accepted_sometimes),
    Case("hybrid:when=always", hybrid(when="always"), greedy(*SOME, "rag"), 40, ran=hybrid_draft_accepted_sometimes),
    # the EAGLE-3 head shipped for the default model (its top-k drafts carry no probabilities: seeded
    # sampling is plain sampling's very tokens; drawn trees, `sampled=true`, are checked by distribution
    # in test_eagle_sampled.py)
    Case("eagle", method("eagle"), greedy(*ALL), fast=True, ran=mat_above_one),
    Case("eagle:adaptive=false,budget=24,topk=4", method("eagle:adaptive=false,budget=24,topk=4"), greedy(*SOME),
         ran=mat_above_one),
    Case("eagle:retrieval=true", method("eagle:retrieval=true"), greedy(*SOME), ran=offered("retrieval")),
    Case("eagle-sampled", method("eagle:sampled=false"), sampled(SOME, SAMPLINGS, rounds=1), 24, fast=True, ran=accepted),
    # the Medusa heads shipped for the default model (deterministic drafts, like eagle's above)
    Case("medusa", method("medusa"), greedy(*ALL), fast=True, ran=mat_above_one),
    Case("medusa:adaptive=false,budget=24,topk=3", method("medusa:adaptive=false,budget=24,topk=3"), greedy(*SOME),
         ran=mat_above_one),
    Case("medusa-sampled", method("medusa"), sampled(SOME, SAMPLINGS, rounds=1), 24, ran=accepted),
    # the Hydra heads shipped for the default model (Medusa's tree, each level guessed for its branch)
    Case("hydra", method("hydra"), greedy(*ALL), fast=True, ran=mat_above_one),
    Case("hydra-sampled", method("hydra"), sampled(SOME, SAMPLINGS, rounds=1), 24, ran=accepted),
    # layer skipping (formerly tests/test_layerskip.py)
    Case("layerskip:k=3,adaptive=false", lambda request: LayerSkipConfig(skip=SKIP, k=3, adaptive=False).build(
        request.getfixturevalue("default_model")), greedy("translation", "mt_bench", "qa"), fast=True),
    Case("layerskip:adaptive=true", lambda request: LayerSkipConfig(skip=SKIP, adaptive=True).build(
        request.getfixturevalue("default_model")), greedy("translation", "mt_bench", "qa")),
)  # fmt: skip


class CaseRuns:
    """Each case's proposer and the outputs of the rows it has served so far, kept for the session."""

    def __init__(self, engine, prompts: dict[str, list[int]]) -> None:
        self.engine, self.prompts = engine, prompts
        self.runs: dict[str, tuple[Any, list]] = {}

    def upto(self, case: Case, index: int, request: pytest.FixtureRequest) -> tuple[Any, list]:
        if case.name not in self.runs:
            self.runs[case.name] = (case.build(request), [])
        proposer, outs = self.runs[case.name]
        while len(outs) <= index:
            category, sampling = case.rows[len(outs)]
            config = GenerationConfig(max_new_tokens=case.new_tokens, sampling=sampling)
            outs.append(self.engine.generate(self.prompts[category], proposer, config))
        return proposer, outs


@pytest.fixture(scope="session")
def case_runs(engine, bench_prompts) -> CaseRuns:
    return CaseRuns(engine, bench_prompts)


def row_id(case: Case, index: int) -> str:
    category, sampling = case.rows[index]
    seen = sum(row == case.rows[index] for row in case.rows[:index])
    temperature = "" if sampling.temperature == 0 else f"-t{sampling.temperature}-seed{sampling.seed}"
    return f"{case.name}-{category}{temperature}" + (f"-again{seen}" if seen else "")


def row_marks(case: Case, index: int) -> list[pytest.MarkDecorator]:
    """A case's rows and its path check share one pytest-xdist worker (the proposer's state carries)."""
    group = pytest.mark.xdist_group(f"lossless-{case.name}")
    return [group] if case.fast and index == 0 else [group, pytest.mark.slow]


ROWS = [
    pytest.param(case, index, id=row_id(case, index), marks=row_marks(case, index))
    for case in CASES
    for index in range(len(case.rows))
]


@pytest.mark.parametrize(("case", "index"), ROWS)
def test_output_is_plain_decodings(case_runs, plain_runs, request, case, index):
    _, outs = case_runs.upto(case, index, request)
    category, sampling = case.rows[index]
    assert outs[index].token_ids == plain_runs.tokens(category, case.new_tokens, sampling)


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=row_marks(case, -1), id=case.name) for case in CASES if case.ran]
)
def test_the_case_exercised_its_path(case_runs, request, case):
    proposer, outs = case_runs.upto(case, len(case.rows) - 1, request)
    assert case.ran(proposer, outs), [out.stats.mat for out in outs]


def test_every_method_has_a_fast_greedy_row():
    from specdec.proposers import METHODS

    fast = {case.name.split(":")[0].split("-")[0] for case in CASES if case.fast and case.rows[0][1] == GREEDY}
    assert fast == set(METHODS) - {"plain"}


# ------------------------------------------------------------------ eight rows in one batch
# Each method's fast matrix case serves eight prompts of every category at once through the one engine,
# with conftest's fixed cost curve, so the node budget cuts trees, rows are padded to the widest tree,
# and rows leave at different steps (different `max_new_tokens`) while the others go on.
BATCH_TOKENS = 32
BATCH_ROWS = (  # (category, max_new_tokens): rows finish at different steps
    ("translation", 32), ("mt_bench", 8), ("qa", 24), ("math_reasoning", 32),
    ("summarization", 16), ("rag", 32), ("counting", 32), ("mt_bench", 4),
)  # fmt: skip
ONE_CASE_PER_METHOD = {
    case.name.split(":")[0].split("-")[0]: case for case in CASES if case.fast and case.rows[0][1] == GREEDY
}
# The fast tier: plain decoding's batch on the five rows with short prompts (40-85 tokens); the full tier: all
# eight, every method. Each prompt is cut to its last BATCH_PROMPT_TOKENS: summarization's and rag's 660-769-token
# fp32 prefills were most of this test's time, and 40-320-token prompts still mix lengths in one batch.
SHORT_ROWS = tuple(row for row in BATCH_ROWS if row[0] not in ("summarization", "rag", "counting"))
BATCH_PROMPT_TOKENS = 320


@pytest.fixture(scope="module")
def batch_prompts(bench_prompts) -> dict[str, list[int]]:
    return {category: bench_prompts[category][-BATCH_PROMPT_TOKENS:] for category, _ in BATCH_ROWS}


def batch_builder(method: str):
    if method == "plain":
        return lambda request: PlainProposer()
    return ONE_CASE_PER_METHOD[method].build


BATCH_METHODS = [  # a group each, so pytest-xdist spreads them over its workers
    pytest.param("plain", SHORT_ROWS, id="plain-short", marks=pytest.mark.xdist_group("batch-plain-short")),
    *(pytest.param(name, BATCH_ROWS, id=name, marks=[pytest.mark.slow, pytest.mark.xdist_group(f"batch-{name}")])
      for name in ["plain", *sorted(ONE_CASE_PER_METHOD)]),
]


@pytest.mark.parametrize(("method", "rows"), BATCH_METHODS)
def test_a_batch_of_eight_rows_each_equal_plain(
    engine, default_model, batch_prompts, plain_runs_of, request, method, rows
):
    build = batch_builder(method)
    prompts = [batch_prompts[category] for category, _ in rows]
    configs = [GenerationConfig(max_new_tokens=n) for _, n in rows]
    proposers = [build(request) for _ in rows]
    costs = load_or_measure(default_model)  # conftest's fixed curve: the node budget cuts trees
    outs = generate_batch(engine, prompts, proposers, configs, costs=costs, max_batch=8)
    plain_runs = plain_runs_of(batch_prompts)
    expected = [plain_runs.tokens(category, BATCH_TOKENS, GREEDY)[:n] for category, n in rows]
    assert [out.token_ids for out in outs] == expected
    assert max(out.stats.num_decode_steps for out in outs) > 0

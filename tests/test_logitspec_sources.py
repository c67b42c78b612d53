"""Recycled successors, the session store and a datastore as sources inside LogitSpec's tree.

Model-free: recycle supplies branches below the root when the context has no
strong match and extends a bare candidate; the session store's branch joins
after the request's own text; the datastore is consulted only without an own
match; rates learned per source; options validated (server-side datastore).
On the real default model (fp32): greedy output with each source is
token-identical to plain greedy on a Spec-Bench prompt of every category, a
repeated request is drafted from the session store, seeded sampling from the
same source state is reproducible.
"""

from __future__ import annotations

import dataclasses
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import CPU_COSTS_CURVE, fresh_logitspec, has_path, prompts_by_category, walk

from specdec.datastore import Datastore, DatastoreError
from specdec.datastore_build import build_datastore, suffix_array
from specdec.engine.costs import CostModel
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.proposers import MethodError, parse_method
from specdec.proposers.logitspec.proposer import LogitSpecConfig, LogitSpecProposer
from specdec.proposers.logitspec.sources import Sources
from specdec.proposers.recycle import RecycleTable
from specdec.proposers.session_store import SessionStore
from specdec.sampling import SamplingParams
from specdec.serve.options import RequestRefused, check_option
from specdec.tree import DraftTree

VOCAB = 32
FREE = CostModel((1, 64), (1.0, 1.0))  # nodes cost nothing: every node above the floor probability is kept
CPU_COSTS = CostModel(*CPU_COSTS_CURVE)
NEW_TOKENS = 16
STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS = [STDLIB / name for name in ("textwrap.py", "string.py", "shlex.py")]  # not benchmark data


def ctx_for(tokens: list[int], logits: torch.Tensor) -> ProposalContext:
    return ProposalContext(tokens, logits, 1, SamplingParams(), 64)


def table_with(rows: dict[int, list[int]]) -> RecycleTable:
    """A recycle table whose row t lists rows[t] best first."""
    table = RecycleTable(VOCAB, 8)
    for token, successors in rows.items():
        logits = torch.zeros(1, VOCAB)
        logits[0, successors] = torch.arange(len(successors), 0, -1, dtype=torch.float32)
        table.update(torch.tensor([token]), logits)
    return table


def proposer_with(sources: Sources, context: list[int], k: int = 0, **options) -> LogitSpecProposer:
    proposer = LogitSpecProposer(LogitSpecConfig(k=k, **options), FREE, (), sources)
    proposer.begin(context[:-1])
    return proposer


# ------------------------------------------------------------------ model-free
def test_recycle_supplies_branches_without_a_strong_match():
    context = [1, 2, 3, 4, 5, 6, 7]  # nothing repeats
    table = table_with({7: [9, 10], 9: [11]})
    proposer = proposer_with(Sources(recycle=table), context)
    tree = proposer.propose(ctx_for(context, torch.zeros(VOCAB)))
    assert has_path(tree, [9, 11]) and has_path(tree, [10])
    assert proposer._last.recycle_rows[7][:2] == [9, 10]
    path = walk(tree, [9, 11, 12])
    assert len(path) == 3
    proposer.observe(VerifyResult([9, 11, 12], path, torch.zeros(tree.num_nodes, VOCAB), tree))
    assert proposer.stats.rate(("recycle", 0)) > 1 / 9  # the top successor was right twice
    assert proposer.source_stats["recycle"]["accepted"] == 2


def test_a_step_asked_for_no_draft_leaves_the_recycle_table_as_it_was():
    """The floor's plain steps (depth 0) cost what `plain`'s do: the table is fed only by steps that drafted."""
    context = [1, 2, 3, 4, 5, 6, 7]
    table = table_with({7: [9, 10]})
    before = table.successors(7)
    proposer = proposer_with(Sources(recycle=table), context)
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 1.0
    plain = ProposalContext(context, torch.zeros(VOCAB), 1, SamplingParams(), 0)
    tree = proposer.propose(plain)
    assert tree.num_nodes == 1
    proposer.observe(VerifyResult([3], [0], logits, tree))
    assert table.successors(7) == before and before[0] == 9
    tree = proposer.propose(ctx_for(context, torch.zeros(VOCAB)))
    proposer.observe(VerifyResult([3], [0], torch.cat([logits, torch.zeros(tree.num_nodes - 1, VOCAB)]), tree))
    assert table.successors(7)[0] == 3  # a drafting step feeds it


def test_recycle_extends_a_bare_candidate():
    context = [1, 2, 3, 4, 5, 6, 7]
    logits = torch.zeros(VOCAB)
    logits[20] = 5.0  # candidate 20: never seen, so nothing retrieved after it
    table = table_with({20: [21]})
    proposer = proposer_with(Sources(recycle=table), context, k=2)
    assert has_path(proposer.propose(ctx_for(context, logits)), [20, 21])


def test_session_store_joins_after_the_own_text():
    store = SessionStore(max_tokens=1000, max_ngram=4)
    store.add([5, 6, 7, 8, 9, 10])  # an earlier request
    context = [1, 2, 3, 5, 6]  # "5 6": seen in the earlier request only
    proposer = proposer_with(Sources(session=store), context)
    tree = proposer.propose(ctx_for(context, torch.zeros(VOCAB)))
    assert has_path(tree, [7, 8, 9, 10]) and "session" in proposer._last.sources
    assert len(store) == 2  # the request's own document


def test_datastore_only_without_an_own_match():
    corpus = np.asarray([5, 6, 7, 8, -1, 1, 2, 3, -1], dtype=np.int32)
    datastore = Datastore(Path("."), corpus, suffix_array(corpus, 8), {"sort_depth": 8, "num_tokens": 9})
    context = [9, 10, 11, 5, 6]  # no own match; "5 6" is in the corpus
    proposer = proposer_with(Sources(datastore=datastore), context)
    assert has_path(proposer.propose(ctx_for(context, torch.zeros(VOCAB))), [7, 8])
    repeated = [5, 6, 7, 12, 5, 6]  # "5 6" repeats in the request itself: the datastore is not asked
    proposer = proposer_with(Sources(datastore=datastore), repeated)
    proposer.propose(ctx_for(repeated, torch.zeros(VOCAB)))
    assert not any(source == "datastore" for source, _ in proposer._last.chains)


def test_source_options_are_validated_and_the_datastore_is_server_side():
    for bad in ("logitspec:adaptive=false,third=true", "logitspec:adaptive=false,session=true"):
        with pytest.raises(MethodError):
            parse_method(bad)
    with pytest.raises(DatastoreError):
        LogitSpecConfig(datastore="/no/such/folder").open_datastore(SimpleNamespace(tokenizer=None))
    assert check_option("logitspec", "recycle", "true", "p") is True
    with pytest.raises(RequestRefused, match="set by the server"):
        check_option("logitspec", "datastore", "/etc", "p")


# ------------------------------------------------------------------ on the real model
@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    return prompts_by_category(default_model.tokenizer, spec_bench_subset)


@pytest.fixture(scope="module")
def stdlib_store(default_model, tmp_path_factory) -> Path:
    return build_datastore(CORPUS, default_model.tokenizer, tmp_path_factory.mktemp("ds") / "stdlib").out_dir


def test_recycle_is_on_by_default_and_off_in_the_paper_mode(default_model):
    def recycle_of(method: str):
        return parse_method(method).assemble(default_model, CPU_COSTS, None).sources.recycle

    assert isinstance(recycle_of("logitspec"), RecycleTable)
    assert recycle_of("logitspec:recycle=false") is None
    assert recycle_of("logitspec:adaptive=false") is None  # the paper's tree has no other sources
    assert recycle_of("logitspec:adaptive=false,recycle=true") is None


def test_seeded_sampling_is_reproducible(engine, default_model, prompts, stdlib_store):
    ids = prompts[next(name for name in prompts if name.startswith("translation"))]
    method = f"logitspec:recycle=true,session=true,third=true,datastore={stdlib_store}"

    def run(seed: int) -> list[int]:
        config = GenerationConfig(max_new_tokens=NEW_TOKENS, sampling=SamplingParams(temperature=0.9, seed=seed))
        return engine.generate(ids, fresh_logitspec(default_model, method), config).token_ids

    first = run(7)
    assert run(7) == first
    assert run(8) != first


def test_draft_trees_stay_within_budget(default_model, prompts, engine):
    proposer = fresh_logitspec(default_model, "logitspec:recycle=true,session=true,third=true,budget=12")
    seen: list[DraftTree] = []
    inner = proposer.propose
    proposer.propose = lambda ctx: seen.append(inner(ctx)) or seen[-1]  # type: ignore[method-assign]
    name, ids = next(iter(prompts.items()))
    engine.generate(ids, proposer, GenerationConfig(max_new_tokens=8))
    assert seen and all(tree.num_nodes <= 12 for tree in seen)


def test_acceptance_rates_carry_from_request_to_request(default_model):
    """By default a request's proposer learns into the rates its model's earlier requests learned (kept in
    `loaded.state` per k and state scope); `shared_rates=false`, another k or another scope start afresh."""
    def built(scope: str = "rates-test", **options) -> LogitSpecProposer:
        loaded = dataclasses.replace(default_model, state_scope=scope)
        return LogitSpecConfig(recycle=False, **options).assemble(loaded, CPU_COSTS, None)

    first, second = built(), built()
    assert first.stats is second.stats
    key = ("cand", 0, 0)
    before = second.stats.rate(key)
    first.stats.update(key, 1.0, 1.0)  # what the first request learned
    assert second.stats.rate(key) > before
    assert built(shared_rates=False).stats is not first.stats
    assert built(k=8).stats is not first.stats
    assert built(scope="another").stats is not first.stats

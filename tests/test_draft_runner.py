"""A draft's graphed sequence (`specdec.backends.torch.draft_runner`): what a draft model runs on a GPU.

On the CPU its passes run eagerly, padded to their buckets exactly as a GPU's graphs replay them: its
appends, trims and resets give the logits of the one-sequence runner a draft runs on here, and a draft
on it keeps plain decoding's text while accepting what a self-draft accepts.
"""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
from helpers import assert_logits_close, tiny_llama

from specdec.backends.registry import draft_runner, runs_graphed, sequence_runner, verify_model
from specdec.backends.torch.draft_runner import GraphedSequence, SequencePool
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.proposers.draft import DraftConfig
from specdec.proposers.layerskip import SkipLayerModel
from specdec.proposers.plain import PlainProposer


def test_the_graphed_sequence_gives_the_runners_logits():
    """Prompt, one token, a chain, a trim, a catch-up longer than any bucket, a reset: the same logits and
    lengths as `TargetModel`'s runner."""
    model = tiny_llama()
    graphed, runner = GraphedSequence(model, use_graphs=False), sequence_runner(model)
    runner.reset()
    long = [(7 * i) % 500 + 1 for i in range(150)]
    for ids, last_only, trim in (
        (list(range(3, 23)), True, None), ([5], False, None), ([6, 7, 8], False, None), ([9, 10], False, 21),
        (long, True, None), ([11, 12, 13], True, 0), ([14, 15], False, None),
    ):  # fmt: skip
        if trim is not None:
            graphed.trim(trim), runner.trim(trim)
        got, want = graphed.append(ids, last_only=last_only), runner.append(ids, last_only=last_only)
        assert got.shape == want.shape == ((1 if last_only else len(ids)), 512)
        assert_logits_close(got, want)
        assert graphed.num_cached == runner.num_cached
    assert graphed.graphed.mode == "eager" and graphed.graphed.eager_passes > 0  # the padded pass ran


def test_a_draft_on_the_graphed_sequence_keeps_plain_text(default_model, engine):
    """The model drafting for itself on the graphed sequence: plain decoding's greedy tokens, and nearly
    every draft accepted (a draft sequence that lost its place, or fed wrong positions, would not be)."""
    prompt = default_model.tokenizer("Count from one to twenty: one, two, three,").input_ids
    config = GenerationConfig(max_new_tokens=32)
    want = engine.generate(prompt, PlainProposer(), config).token_ids
    proposer = DraftConfig(k=4, adaptive=False).build_with(default_model, default_model.model)
    proposer.runner = GraphedSequence(verify_model(default_model), use_graphs=False)
    out = engine.generate(prompt, proposer, config)
    assert out.token_ids == want
    assert out.stats.acceptance_rate > 0.9
    assert proposer.runner.graphed.eager_passes > 0


@pytest.mark.parametrize("options", [{"adaptive": False}, {"schedule": "heuristic"}], ids=["fixed", "heuristic"])
def test_a_fixed_chain_drafted_on_the_device_is_the_hosts(default_model, engine, options):
    """Where no confidence rule stops a greedy chain (a fixed k, transformers' heuristic), a GPU drafts it on
    the device (`greedy_chain`: each pass's token the argmax after the one before, read once at the end). On
    the CPU the same padded passes run eagerly: every step's chain is the one the host's loop drafts, pick by
    pick, and the text is plain's."""
    prompt = default_model.tokenizer("Count from one to twenty: one, two, three,").input_ids
    settings = GenerationConfig(max_new_tokens=32)
    want = engine.generate(prompt, PlainProposer(), settings).token_ids
    runs = []
    for on_device in (False, True):
        proposer = DraftConfig(k=4, **options).build_with(default_model, default_model.model)
        proposer.runner = GraphedSequence(verify_model(default_model), use_graphs=False)
        proposer.device_chain = on_device
        chains, chained = [], []
        propose, greedy_chain = proposer.propose, proposer.runner.greedy_chain

        def recorded(ctx, propose=propose, chains=chains):  # noqa: ANN001, ANN202 - the proposer's own call
            tree = propose(ctx)
            chains.append(tree.token_list)
            return tree

        def counted(*args, greedy_chain=greedy_chain, chained=chained):  # noqa: ANN002, ANN202
            chained.append(args[1])
            return greedy_chain(*args)

        proposer.propose, proposer.runner.greedy_chain = recorded, counted
        out = engine.generate(prompt, proposer, settings)
        runs.append((out.token_ids, chains, chained))
    (text, chains, host_chained), (device_text, device_chains, chained) = runs
    assert device_chains == chains and text == device_text == want
    assert not host_chained and len(chained) == sum(len(chain) > 1 for chain in chains) and max(chained) >= 3


def test_proposers_lease_the_drafts_sequences_one_at_a_time(default_model, engine):
    """The API builds a draft proposer a call, and on a GPU each one's own sequence captured its graphs again.
    The draft's pool lends each proposer a sequence for its life and takes it back, reset, when the proposer is
    collected: a later proposer gets the same sequence (its graphs), proposers alive together hold their own,
    and a sequence leased again decodes plain decoding's text, accepting nearly every draft."""
    prompt = default_model.tokenizer("Count from one to twenty: one, two, three,").input_ids
    settings = GenerationConfig(max_new_tokens=32)
    want = engine.generate(prompt, PlainProposer(), settings).token_ids
    config = DraftConfig(k=4, adaptive=False)
    pool = SequencePool(verify_model(default_model), use_graphs=False)
    prepared = replace(config.prepare(default_model, default_model.model), runners=pool)
    first = config.build_prepared(default_model, prepared)
    sequence = first.runner
    assert engine.generate(prompt, first, settings).token_ids == want and sequence.num_cached > len(prompt)
    second = config.build_prepared(default_model, prepared)  # while the first is alive
    assert second.runner is not sequence and pool.made == 2
    del first
    gc.collect()
    third = config.build_prepared(default_model, prepared)
    assert third.runner is sequence and pool.made == 2 and sequence.num_cached == 0
    out = engine.generate(prompt, third, settings)
    assert out.token_ids == want and out.stats.acceptance_rate > 0.9


def test_a_drafts_own_module_leases_from_its_pool_on_cuda_only(default_model):
    """Only a GPU's graphed draft pools its sequences (kept in the draft's state); on the CPU a proposer runs
    a sequence runner of its own."""
    from specdec.models.state import ModelState

    draft = replace(default_model, state=ModelState())
    prepared = DraftConfig(k=4, adaptive=False).prepare(default_model, draft.model, draft)
    assert prepared.runners is None and isinstance(DraftConfig().build_prepared(default_model, prepared).runner,
                                                   TargetModel)


def test_drafts_run_graphed_on_cuda_only():
    model = tiny_llama()
    assert not runs_graphed(model)  # on the CPU
    assert isinstance(draft_runner(model), TargetModel)
    assert not runs_graphed(SkipLayerModel(model, (0,)))  # a last-row view never runs graphed

"""The hybrid (LogitSpec's tree plus a draft model's chain) and universal assisted generation (fp32, real model).

Draft stand-ins: `small_draft` (24 of the default model's 30 layers: accepted about
half the time) and the default model itself (a perfect draft, so misaligned rows or
tokens show as rejections). Universal assisted generation is checked twice: the
default model drafting through text for itself (same tokenizer, forced through text:
its drafts should still be accepted, so the text round trip is exercised on accepted
paths), and a tiny random model with a byte-level BPE tokenizer trained here (a
genuinely different vocabulary: its drafts are mostly rejected, the output must not move).
"""

from __future__ import annotations

import pytest
import torch
from helpers import prompts_by_category
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.models import load_model
from specdec.proposers import MethodError, parse_method
from specdec.proposers.draft import DraftConfig
from specdec.proposers.hybrid import HybridConfig, HybridProposer, append_sampled_chain, merge_chain
from specdec.proposers.hybrid_gate import EXPLORE_EVERY, MIN_ASKS, AskGate
from specdec.proposers.universal import UniversalDraftProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

pytestmark = pytest.mark.slow  # the full tier (make test-all): draft-model runs on the real model

NEW_TOKENS = 40
CATEGORIES = ("mt_bench", "summarization", "math_reasoning", "rag")


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    return prompts_by_category(default_model.tokenizer, spec_bench_subset, CATEGORIES)


@pytest.fixture(scope="module")
def plain(plain_runs, prompts):
    return {name: plain_runs.tokens(name.rsplit("-", 1)[0], NEW_TOKENS) for name in prompts}


def hybrid(default_model, draft_module, **options) -> HybridProposer:
    """A hybrid over an in-memory draft module (`heuristic` lengths in tests: the cost rules rightly find
    that a draft as large as the target never pays, and would draft nothing)."""
    config = HybridConfig(draft_model="in-memory", **options)
    draft = config.draft_config().build_with(default_model, draft_module)
    return HybridProposer(config, config.logitspec_config().build(default_model), draft, default_model.model.config.vocab_size)


def run(engine, proposer, prompt, sampling=None, new_tokens=NEW_TOKENS):
    return engine.generate(prompt, proposer, GenerationConfig(max_new_tokens=new_tokens, sampling=sampling or SamplingParams()))


def test_hybrid_with_a_perfect_draft_is_accepted(engine, default_model, prompts, plain):
    proposer = hybrid(default_model, default_model.model, when="always", schedule="heuristic", max_k=4)
    name, prompt = next(iter(prompts.items()))
    out = run(engine, proposer, prompt)
    assert out.token_ids == plain[name]
    assert out.stats.mat > 3.0
    assert proposer.source_stats["draft"]["accepted"] > 0


def test_hybrid_sampling_is_seeded_and_accepts_a_perfect_draft(engine, default_model, prompts):
    prompt = next(iter(prompts.values()))
    sampling = SamplingParams(temperature=0.8, seed=5)
    outputs = [run(engine, hybrid(default_model, default_model.model, when="always", schedule="heuristic"), prompt,
                   sampling, 24) for _ in range(2)]  # fmt: skip
    assert outputs[0].token_ids == outputs[1].token_ids
    assert outputs[0].stats.mat > 2.0  # a perfect draft's draws are accepted with probability 1


def test_merge_shares_a_prefix_and_sampled_chains_stay_apart():
    tree = DraftTree.from_branches(5, [[1, 2], [3]])  # root 5 -> 1 -> 2, root -> 3
    merged, ids = merge_chain(tree, [1, 4, 5])
    assert merged.parent_list == [-1, 0, 1, 0, 1, 4] and merged.token_list == [5, 1, 2, 3, 4, 5]
    assert ids == [1, 4, 5]
    rows = torch.softmax(torch.randn(3, 6), -1)
    chain = DraftTree(torch.tensor([5, 1, 4]), torch.tensor([-1, 0, 1]), rows)
    joined, ids = append_sampled_chain(tree, chain, 6)
    assert joined.parent_list == [-1, 0, 1, 0, 0, 4] and ids == [4, 5]
    assert joined.draft_probs[1].tolist() == [0, 1, 0, 0, 0, 0]  # a retrieval node: all mass on its token
    assert torch.equal(joined.draft_probs[4:], rows[1:])


def test_hybrid_options():
    config = parse_method("hybrid:draft_model=m,when=always,max_k=3")
    assert (config.draft_model, config.when, config.max_k) == ("m", "always", 3)
    with pytest.raises(MethodError, match="when"):
        parse_method("hybrid:when=sometimes")
    with pytest.raises(MethodError, match="rate"):
        parse_method("hybrid:rate=sometimes")
    with pytest.raises(ValueError, match="draft model"):
        HybridConfig().build(None)


# ---------------------------------------------------------------- universal assisted generation
@pytest.fixture(scope="module")
def other_tokenizer_model(tmp_path_factory, spec_bench_subset):
    """A tiny random Llama with a byte-level BPE tokenizer (512 entries) trained on Spec-Bench text."""
    folder = tmp_path_factory.mktemp("other-tokenizer")
    texts = [turn for q in load_questions(spec_bench_subset) for turn in q.turns]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_draft_with_another_tokenizer_is_identical(engine, default_model, prompts, plain, other_tokenizer_model):
    draft = load_model(str(other_tokenizer_model), dtype="fp32")
    assert len(draft.tokenizer) != len(default_model.tokenizer)
    proposer = DraftConfig(draft_model=str(other_tokenizer_model), k=3, adaptive=False).build_loaded(
        default_model, draft
    )
    assert isinstance(proposer, UniversalDraftProposer)
    for name, prompt in prompts.items():
        assert run(engine, proposer, prompt).token_ids == plain[name], name
    sampling = SamplingParams(temperature=0.9, seed=3)
    outputs = [run(engine, proposer, prompt, sampling, 16).token_ids for _ in range(2)]
    assert outputs[0] == outputs[1]


def test_text_mapping_keeps_the_seam(default_model):
    proposer = DraftConfig(draft_model="self", text="always").build_loaded(default_model, default_model)
    tokenizer = default_model.tokenizer
    context = tokenizer.encode("The quick brown fox jumps over the", add_special_tokens=False)
    assert proposer.to_target(context, " lazy dog") == tokenizer.encode(" lazy dog", add_special_tokens=False)
    assert proposer.to_draft(context) == context


def test_ask_gate_closes_on_losing_asks_and_explores():
    gate = AskGate(per_kind=True)
    for _ in range(MIN_ASKS):
        assert gate.should_ask()
        gate.step(0, tokens=2, seconds=0.1)  # LogitSpec alone on these steps: 20 tokens/s
        gate.asked(0, gain=1, cost_s=0.1)  # one extra token for 0.1 s (2 tokens at 20/s): a loss
    decisions = []
    for _ in range(EXPLORE_EVERY):
        decisions.append(gate.should_ask())
        gate.step(0, tokens=2, seconds=0.1)
    assert decisions == [False] * (EXPLORE_EVERY - 1) + [True]  # closed, then one exploring ask
    gate.asked(0, gain=0, cost_s=0.1)  # the exploring ask lost too: explore half as often
    assert gate.kinds[0].explore_every == 2 * EXPLORE_EVERY and gate.skipped == EXPLORE_EVERY - 1
    assert gate.should_ask(key=1)  # another kind of step has its own record: asked until judged


def test_ask_gate_judges_against_logitspecs_own_rate_on_that_kind_of_step():
    gate = AskGate(per_kind=True)
    for _ in range(30):
        for key, rate in ((0, 5.0), (1, 40.0)):  # weak retrieval: 5 tokens/s alone; richer: 40
            assert gate.should_ask(key) or key == 1
            gate.step(key, tokens=1, seconds=1 / rate)
            gate.asked(key, gain=2, cost_s=0.1)  # 2 extra tokens for 0.1 s: 20 tokens/s
    assert gate.rate(0) == pytest.approx(5.0) and gate.rate(1) == pytest.approx(40.0)
    assert gate.should_ask(0) and not gate.should_ask(1)  # pays where LogitSpec alone is slow, not where it is fast
    # one extra token per 0.1 s (10 tokens/s): beats LogitSpec's 5 on weak steps, not its 12 over all steps
    kind, cautious = AskGate(per_kind=True), AskGate(per_kind=False)
    for gate in (kind, cautious):
        for _ in range(30):
            for key, rate in ((0, 5.0), (1, 40.0), (2, 40.0)):
                gate.should_ask(key)
                gate.step(key, tokens=1, seconds=1 / rate)
                gate.asked(key, gain=1, cost_s=0.1)
    assert cautious.rate(0) == pytest.approx(12.0)  # every kind's tokens over every kind's seconds
    assert kind.should_ask(0) and not cautious.should_ask(0)


def test_hybrid_gate_stops_asking_a_draft_that_never_pays(engine, default_model, prompts, plain):
    """A random draft sharing the vocabulary is never right: the gate closes after MIN_ASKS, output unchanged."""
    config = LlamaConfig(vocab_size=default_model.model.config.vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    torch.manual_seed(0)
    proposer = hybrid(default_model, LlamaForCausalLM(config).eval(), schedule="timed")
    for name, prompt in list(prompts.items())[:2]:
        assert run(engine, proposer, prompt).token_ids == plain[name], name
    assert proposer.gate.asks >= MIN_ASKS and proposer.gate.skipped > proposer.gate.asks
    assert proposer.source_stats.get("draft", {}).get("accepted", 0) == 0


def test_hybrid_draft_reads_the_context_only_at_its_first_ask(engine, default_model, small_draft, prompts, plain):
    proposer = hybrid(default_model, small_draft, when="always", schedule="heuristic")
    proposer.begin(list(range(1, 50)))
    assert proposer.draft.cached == []  # no prefill for a request the draft may never be asked about
    name, prompt = next(iter(prompts.items()))
    out = run(engine, proposer, prompt)
    assert out.token_ids == plain[name] and len(proposer.draft.cached) > out.stats.num_prompt_tokens

"""The decode loop on the real default model (fp32): plain decoding equals transformers'
greedy `generate`, oracle proposers are lossless with the expected MAT, and stop
conditions hold inside accepted runs."""

from __future__ import annotations

import pytest
import torch

from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.prompts import encode_prompt
from specdec.proposers.base import ProposerBase
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

NEW_TOKENS = 28


CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning")


@pytest.fixture(scope="module")
def prompts(bench_prompts):
    """Five Spec-Bench prompts of different categories, chat-templated."""
    return [bench_prompts[category] for category in CATEGORIES]


@pytest.fixture(scope="module")
def greedy_outputs(plain_runs):
    """Plain decoding's outputs (the run's shared ones: conftest's `plain_runs`)."""
    return [plain_runs.tokens(category, NEW_TOKENS) for category in CATEGORIES]


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=list(model.eos_token_ids), pad_token_id=model.eos_token_ids[0],
    )
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize(  # the fast tier: a short prompt and a long one
    "category", [c if c in ("mt_bench", "summarization") else pytest.param(c, marks=pytest.mark.slow) for c in CATEGORIES]
)
def test_plain_greedy_equals_transformers_generate(default_model, prompts, greedy_outputs, category):
    index = CATEGORIES.index(category)
    assert greedy_outputs[index] == hf_greedy(default_model, prompts[index], NEW_TOKENS)


class OracleProposer(ProposerBase):
    """Proposes the true greedy continuation (known in advance) as a chain or a tree with decoys."""

    def __init__(self, prompt_len: int, truth: list[int], depth: int, decoys: int = 0, vocab: int = 49152):
        self.prompt_len, self.truth, self.depth, self.decoys, self.vocab = prompt_len, truth, depth, decoys, vocab

    def begin(self, prompt_ids):
        assert len(prompt_ids) == self.prompt_len

    def propose(self, ctx: ProposalContext) -> DraftTree:
        done = len(ctx.token_ids) - self.prompt_len  # tokens generated, the root included
        assert ctx.token_ids[self.prompt_len:] == self.truth[:done]  # the engine only ever keeps the truth
        upcoming = self.truth[done : done + self.depth]
        branches = []  # wrong siblings at every level, listed before the true branch
        for level in range(len(upcoming)):
            for d in range(self.decoys):
                branches.append([*upcoming[:level], (upcoming[level] + 1 + d) % self.vocab])
        branches.append(upcoming)
        return DraftTree.from_branches(ctx.token_ids[-1], branches)

    def observe(self, result):
        pass


class RandomProposer(ProposerBase):
    def __init__(self, seed: int, depth: int = 4, vocab: int = 49152):
        self.gen, self.depth, self.vocab = torch.Generator().manual_seed(seed), depth, vocab

    def begin(self, prompt_ids):
        pass

    def propose(self, ctx):
        drafts = torch.randint(0, self.vocab, (self.depth,), generator=self.gen).tolist()
        return DraftTree.chain(ctx.token_ids[-1], drafts)

    def observe(self, result):
        pass


@pytest.mark.parametrize("depth,decoys", [(3, 0), (5, 3)])
def test_oracle_is_lossless_with_mat_depth_plus_one(engine, prompts, greedy_outputs, depth, decoys):
    truth = greedy_outputs[0]
    assert len(truth) == NEW_TOKENS
    # 1 token from the prefill, then steps of depth + 1 that fit exactly.
    num_tokens = 1 + (depth + 1) * ((NEW_TOKENS - 1) // (depth + 1))
    oracle = OracleProposer(len(prompts[0]), truth, depth, decoys)
    out = engine.generate(prompts[0], oracle, GenerationConfig(max_new_tokens=num_tokens))
    assert out.token_ids == truth[:num_tokens]
    assert all(step.num_accepted == depth for step in out.stats.steps)
    assert out.stats.mat == depth + 1
    assert out.stats.num_forward_passes == 1 + (num_tokens - 1) // (depth + 1)


def test_random_drafts_are_lossless_with_mat_one(engine, prompts, greedy_outputs):
    out = engine.generate(prompts[1], RandomProposer(seed=0), GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert out.token_ids == greedy_outputs[1]
    assert out.stats.mat == pytest.approx(1.0)
    assert out.stats.acceptance_rate == 0.0


def test_max_new_tokens_is_exact_inside_an_accepted_run(engine, prompts, greedy_outputs):
    truth = greedy_outputs[2]
    for limit in (1, 2, 7):  # 7 cuts the second step (1 + 5 + ...) in the middle of its run
        oracle = OracleProposer(len(prompts[2]), truth, depth=5)
        out = engine.generate(prompts[2], oracle, GenerationConfig(max_new_tokens=limit))
        assert out.token_ids == truth[:limit]
        assert out.finish_reason == "length"


def test_eos_inside_an_accepted_run_stops_there(default_model, engine):
    prompt = encode_prompt(default_model.tokenizer, "Reply with the single word: yes", chat=True)
    plain = engine.generate(prompt, PlainProposer(), GenerationConfig(max_new_tokens=64))
    assert plain.finish_reason == "stop" and plain.token_ids[-1] in default_model.eos_token_ids
    # The oracle drafts beyond the EOS; nothing after it may be emitted.
    truth = plain.token_ids + [42, 43, 44, 45]
    out = engine.generate(prompt, OracleProposer(len(prompt), truth, depth=6), GenerationConfig(max_new_tokens=64))
    assert out.token_ids == plain.token_ids
    assert out.finish_reason == "stop"
    assert out.text == plain.text


def test_stop_string_cuts_text_and_streaming_matches(engine, prompts, greedy_outputs, default_model):
    full = default_model.tokenizer.decode(greedy_outputs[0], skip_special_tokens=True)
    stop = full[20:26]
    pieces: list[str] = []
    out = engine.generate(prompts[0], PlainProposer(), GenerationConfig(NEW_TOKENS, stop=(stop,)),
                          on_text=pieces.append)
    assert out.finish_reason == "stop"
    assert out.text == full[: full.index(stop)]
    assert "".join(pieces) == out.text
    assert out.token_ids == greedy_outputs[0][: len(out.token_ids)]


def test_streaming_concatenation_equals_text(engine, prompts):
    pieces: list[str] = []
    out = engine.generate(prompts[3], PlainProposer(), GenerationConfig(24), on_text=pieces.append)
    assert "".join(pieces) == out.text
    assert all("\ufffd" not in piece for piece in pieces)


def test_seeded_sampling_is_reproducible_and_seeds_differ(engine, prompts):
    def run(seed):
        sampling = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        return engine.generate(prompts[4], PlainProposer(), GenerationConfig(24, sampling)).token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_bad_input(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], PlainProposer(), GenerationConfig(8))
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="token ids"):
        engine.generate([1, 10**7], PlainProposer(), GenerationConfig(8))
    with pytest.raises(ValueError, match="context"):
        engine.generate([1] * 9000, PlainProposer(), GenerationConfig(8))


def test_decode_rate_leaves_the_prefill_and_its_token_out(engine, prompts):
    """The demo's tokens/s: tokens after the prefill's own over the time after the prefill."""
    stats = engine.generate(prompts[0], PlainProposer(), GenerationConfig(max_new_tokens=6)).stats
    assert stats.prefill_s > 0 and stats.wall_time_s > stats.prefill_s
    expected = (stats.num_new_tokens - 1) / (stats.wall_time_s - stats.prefill_s)
    assert stats.decode_tokens_per_s == pytest.approx(expected)

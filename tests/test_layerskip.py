"""The `layerskip` method on the real default model (fp32): the skipping view shares
the target's weights and, with nothing skipped, reproduces it exactly (cache
included); greedy decoding is token-identical to plain decoding; calibration
scores are exact simulations and its result is cached."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import SKIP

from specdec.backends.torch.target import TargetModel
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.models import LoadedModel
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.layerskip import (
    VERIFY_COST_PER_TOKEN,
    LayerSkipConfig,
    SkipLayerModel,
    calibrate,
    calibrated_skip,
    calibration_path,
    cost_ratio,
    parse_skip,
    simulated_speedup,
)
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow  # the full tier (make test-all): calibration runs on the real model

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset, categories=["mt_bench", "qa", "translation"], per_category=1)
    return [encode_prompt(default_model.tokenizer, q.turns[0], chat=True) for q in questions]


def test_view_shares_weights_and_skips_layers(default_model):
    model = default_model.model
    view = SkipLayerModel(model, parse_skip(SKIP))
    target_ids = {id(p) for p in model.parameters()}
    assert all(id(p) in target_ids for p in view.parameters())
    assert len(view.layers) == model.config.num_hidden_layers - 10
    assert view.layer_ids[:5] == [0, 1, 2, 3, 5]
    with pytest.raises(ValueError):
        SkipLayerModel(model, (model.config.num_hidden_layers,))


@torch.inference_mode()
def test_view_without_skips_matches_the_model_with_its_cache(default_model, prompts):
    """Prefill in two chunks, then one token, through our own cache: same logits as the full model."""
    model = default_model.model
    tokens = prompts[0][:40]
    full = model(input_ids=torch.tensor([tokens])).logits[0]  # [T, V]
    runner = TargetModel(SkipLayerModel(model, ()))
    runner.reset()
    first = runner.append(tokens[:25])[-1]
    second = runner.append(tokens[25:39])[-1]
    third = runner.append(tokens[39:])[-1]
    assert torch.allclose(first, full[24], atol=1e-4)
    assert torch.allclose(second, full[38], atol=1e-4)
    assert torch.allclose(third, full[39], atol=1e-4)
    runner.trim(30)  # roll back and go another way: matches a fresh run over the new text
    other = runner.append([tokens[5], tokens[6]])[-1]
    reference = model(input_ids=torch.tensor([tokens[:30] + [tokens[5], tokens[6]]])).logits[0, -1]
    assert torch.allclose(other, reference, atol=1e-4)


@torch.inference_mode()
def test_view_with_skips_matches_a_truncated_forward(default_model, prompts):
    """Skipping layers in the view == running the kept layers by hand over the whole text."""
    model = default_model.model
    tokens = torch.tensor([prompts[1][:30]])
    skip = parse_skip(SKIP)
    view_logits = SkipLayerModel(model, skip)(tokens, all_logits=True).logits[0]
    hidden = model.model.embed_tokens(tokens)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    rotary = model.model.rotary_emb(hidden, position_ids=positions)
    causal = torch.full((30, 30), torch.finfo(hidden.dtype).min).triu(1)[None, None]
    for i, layer in enumerate(model.model.layers):
        if i not in skip:
            hidden = layer(hidden, attention_mask=causal, position_ids=positions, position_embeddings=rotary)
    expected = model.lm_head(model.model.norm(hidden))[0]
    assert torch.allclose(view_logits, expected, atol=1e-4)


def test_seeded_sampling_is_reproducible(engine, default_model, prompts):
    config = GenerationConfig(max_new_tokens=32, sampling=SamplingParams(temperature=0.8, seed=5))
    method = LayerSkipConfig(skip=SKIP, k=3, adaptive=False)
    runs = [engine.generate(prompts[0], method.build(default_model), config).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_simulated_speedup_is_exact():
    # All agree: k = 8 drafts accepted every step -> 9 tokens per step of cost 1 + 8c.
    assert simulated_speedup([True] * 90, 0.1) == pytest.approx(90 / (10 * 1.8))
    # Never agree: no k beats plain decoding.
    assert simulated_speedup([False] * 50, 0.1) == 1.0
    # Alternating agree/disagree with k = 1: 2 tokens per step of cost 1.1.
    assert simulated_speedup([True, False] * 20, 0.1, max_k=1) == pytest.approx(40 / (20 * 1.1))


def test_cost_ratio_falls_with_skipped_layers(default_model):
    model = default_model.model
    layers = model.config.num_hidden_layers
    ratios = [cost_ratio(model, kept) for kept in (layers, layers // 2, 1)]
    assert ratios[0] == pytest.approx(1.0)
    assert ratios[0] > ratios[1] > ratios[2] > 0


def test_calibration_result_is_read_from_the_cache(default_model, tmp_path, engine, prompts):
    path = calibration_path(default_model, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"skip": [3, 5], "speedup": 1.1, "num_layers": 30}))
    proposer = LayerSkipConfig(cache_dir=str(tmp_path)).build(default_model)
    assert proposer.runner.model.layer_ids == [i for i in range(30) if i not in (3, 5)]


def test_a_calibration_where_nothing_pays_decodes_plainly_and_says_so(default_model, tmp_path):
    path = calibration_path(default_model, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"skip": [], "speedup": 1.0, "num_layers": 30}))
    with pytest.warns(UserWarning, match="no skip set pays off"):
        proposer = LayerSkipConfig(cache_dir=str(tmp_path)).build(default_model)
    assert isinstance(proposer, PlainProposer)


def test_calibration_finds_and_caches_a_skip_set(default_model, tmp_path):
    """A real (small) calibration: a 4-layer model made of the default model's own weights."""
    target = default_model.model
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 4
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:4]
    small = type(target)(config)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < 4}
    small.load_state_dict(state, strict=True)
    loaded = LoadedModel(small.eval().requires_grad_(False), default_model.tokenizer, "small-4")
    result = calibrate(loaded)
    assert result["num_layers"] == 4 and len(result["skip"]) < 4
    assert bool(result["skip"]) == (result["speedup"] > 1.0)  # a skip set only where it pays
    assert result["speedup"] >= 1.0
    skip = calibrated_skip(loaded, VERIFY_COST_PER_TOKEN, tmp_path)
    assert list(skip) == result["skip"]  # deterministic search, now cached
    assert json.loads(calibration_path(loaded, tmp_path).read_text())["skip"] == result["skip"]


def test_options_are_validated():
    with pytest.raises(ValueError):
        LayerSkipConfig(skip="1,x")
    with pytest.raises(ValueError):
        LayerSkipConfig(k=0)
    config = parse_method("layerskip:skip=1+2,k=2")
    assert parse_skip(config.skip) == (1, 2) and config.k == 2

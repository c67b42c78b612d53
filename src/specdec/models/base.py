"""What every model source shares: `LoadedModel`, the load errors, the cache folder, sha256 checks.

Why this module exists: loading, GGUF conversion and pulled models all need
these few names, and keeping them here lets those modules import each other's
basics without an import cycle.

Invariants: every error raised while loading a model is a `ModelLoadError`
(or its subclass `UnsupportedModelError`) with a one-line, actionable message.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.choices import DEFAULT_BACKEND
from specdec.errors import ModelLoadError, UnsupportedModelError
from specdec.models.state import ModelState

SHA_PREFIX_CHARS = 12


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode, its tokenizer, and the name it was loaded by."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    # Proposers built on the same model and scope share what they learn across requests (the
    # session store, the recycle table: kept in `state` under keys that include the scope); the bench
    # gives each method its own scope, so one method never drafts from another method's output for
    # the same prompt.
    state_scope: str = ""
    # How the engine verifies on this model: with prepacked Linear weights where that is exact
    # ("auto"), also in fp32 ("on"), never ("off"), or with 4-bit weights ("int4", CPU: the model
    # verified is then the quantized one, `specdec.backends.torch.int4`): `specdec.backends.torch.packed.verify_model`. Carried here,
    # not by the engine, so the cost curves that size the drafts time the same model the engine runs.
    pack: str = "auto"
    # Whether that verification is batch-invariant (`specdec.backends.torch.invariant`): "off" or "on" (packed
    # weights needed). Here for the same reason as `pack`.
    exact: str = "auto"
    # Which engine verifies: "torch" (the transformers model above), "compiled" (the same, its
    # verification pass compiled by inductor: `specdec.backends.compiled`) or "llamacpp" (llama.cpp's, on the
    # GGUF file the model came from: `specdec.backends.llamacpp`). `gguf_path`: that file, None for other sources.
    backend: str = DEFAULT_BACKEND
    gguf_path: Path | None = None
    # What outlives one proposer or request (`models.state`): made here, at load time, and handed
    # to every proposer through `config.build(loaded)`; `dataclasses.replace` keeps the same object.
    state: ModelState = field(default_factory=ModelState, compare=False, repr=False)

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
    """specdec's cache (converted models, cost curves, calibrations) unless `cache_dir` says otherwise.

    `$XDG_CACHE_HOME/specdec` where the XDG base-directory variable is set, else ~/.cache/specdec.
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "specdec"


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


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__




def translate_error(error: Exception, source: str) -> ModelLoadError:
    """Map a transformers / hub exception to a one-line ModelLoadError."""
    reason = one_line(error)
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

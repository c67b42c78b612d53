"""Optional dependencies: which extra provides them, and one readable line when one is missing.

Why this module exists: a lean install (no extras) loads a model and generates;
the server needs the `serve` extra and the benchmark and analysis plots the
`bench` extra. The CLI checks a subcommand's extra before it loads a model or
runs anything, so a missing package ends in one line that says what to
install, never in a traceback after a long run.

Invariants: presence is checked with `importlib.util.find_spec`, which imports
nothing, so the check stays cheap; `EXTRAS` mirrors the extras declared in
pyproject.toml (top-level module names, not distribution names).
"""

from __future__ import annotations

import importlib.util
from importlib import metadata

from specdec.errors import SpecdecError

# The distribution's name on PyPI; the import package stays `specdec` (PyPI's `specdec` is another project).
DISTRIBUTION = "specdec-hf"

EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "starlette", "uvicorn", "h11", "prometheus_client"),
    "bench": ("matplotlib",),
}


class MissingExtraError(SpecdecError):
    """A subcommand needs packages from an extra that is not installed."""


def require_extra(extra: str, purpose: str) -> None:
    """Raise MissingExtraError naming the install command if any module of `extra` is absent."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(
            f"{purpose} needs the {extra} extra ({', '.join(missing)} not installed): "
            f"pip install '{DISTRIBUTION}[{extra}]'"
        )


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None where it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None

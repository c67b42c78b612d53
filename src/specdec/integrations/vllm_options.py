"""Options of the vLLM proposers, read from the environment and an optional JSON file.

Why this channel: vLLM builds a `custom_class` proposer as `Class(vllm_config)`
and its `speculative_config` schema is fixed (method, model,
num_speculative_tokens, ...), so a proposer's own options cannot travel in it.
They come instead from

1. `SPECDEC_VLLM_CONFIG=/path/options.json`: one JSON object, e.g.
   `{"k": 60, "node_cost": 0.05}`;
2. `SPECDEC_VLLM_<NAME>` environment variables (`SPECDEC_VLLM_K=30`), which
   override the file;
3. the defaults below.

The draft length is vLLM's own `num_speculative_tokens`.

Invariants: options are frozen dataclasses validated when the proposer is built,
so a bad value stops vLLM at startup with a one-line message, never mid-serving;
a key that no specdec vLLM proposer knows is an error (a typo must not be
silently ignored); keys of the other proposer are ignored, so one file can hold
both proposers' options.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from specdec.proposers.logitspec.proposer import LogitSpecConfig
from specdec.proposers.pld import PLDConfig

ENV_PREFIX = "SPECDEC_VLLM_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


@dataclass(frozen=True)
class LogitSpecOptions:
    """LogitSpec in chain mode.

    k: next-next candidates from the top-k of the logits the root was drawn from (paper: 60);
    max_ngram: longest suffix matched in the n-gram index (falls back to 1);
    prefer: which earlier occurrence a match continues, "latest" or "earliest";
    node_cost: what one more draft token costs, as a share of a decoding step's
      expected gain of one token: a chain keeps a token while its chance of being
      accepted exceeds this (0 = the longest most promising chain);
    measure_cost: price draft tokens by the engine's measured steps
      (`step_cost.StepCost`: the seconds a carried token adds, at the current
      tokens per second) once enough steps are seen; node_cost until then, and
      always when false.
    """

    k: int = 60
    max_ngram: int = 3
    prefer: str = "latest"
    node_cost: float = 0.05
    measure_cost: bool = True

    def __post_init__(self) -> None:
        LogitSpecConfig(k=self.k, max_ngram=self.max_ngram, prefer=self.prefer)  # the same checks
        if not 0.0 <= self.node_cost < 1.0:
            raise ValueError(f"node_cost must be in [0, 1), got {self.node_cost}")


@dataclass(frozen=True)
class PromptLookupOptions:
    """Prompt lookup (transformers' semantics): max_ngram, min_ngram and prefer as in `PLDConfig`."""

    max_ngram: int = 3
    min_ngram: int = 1
    prefer: str = "earliest"

    def __post_init__(self) -> None:
        PLDConfig(max_ngram=self.max_ngram, min_ngram=self.min_ngram, prefer=self.prefer)  # the same checks


OPTION_CLASSES = (LogitSpecOptions, PromptLookupOptions)


def _known_fields() -> dict[str, Any]:
    """Every option name of any proposer -> its default (whose type the value must have)."""
    known: dict[str, Any] = {}
    for cls in OPTION_CLASSES:
        known.update({f.name: f.default for f in fields(cls)})
    return known


def _typed(name: str, value: Any, default: Any, source: str) -> Any:
    """`value` converted to the type of `default`; ValueError naming `source` otherwise."""
    kind = type(default)
    if kind is bool:
        return _boolean(name, value, source)
    try:
        if isinstance(value, str) and kind is not str:
            return kind(value.strip())
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
    except ValueError:
        pass
    raise ValueError(f"{source}: option {name!r} must be a {kind.__name__}, got {value!r}")


def _boolean(name: str, value: Any, source: str) -> bool:
    """A JSON boolean, or a word such as "1", "true", "no" (bool("false") would be True)."""
    if isinstance(value, bool):
        return value
    words = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise ValueError(f"{source}: option {name!r} must be a bool (true/false, 1/0), got {value!r}")


def _from_file(path: str, known: Mapping[str, Any]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{CONFIG_ENV}={path}: cannot read a JSON object ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{CONFIG_ENV}={path}: must hold one JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{CONFIG_ENV}={path}: unknown options {unknown}; known: {sorted(known)}")
    return {name: _typed(name, value, known[name], path) for name, value in data.items()}


def read_options(cls: type, environ: Mapping[str, str] | None = None) -> Any:
    """An instance of `cls` (LogitSpecOptions or PromptLookupOptions): file, then environment, then defaults."""
    environ = os.environ if environ is None else environ
    known = _known_fields()
    values: dict[str, Any] = {}
    path = environ.get(CONFIG_ENV, "").strip()
    if path:
        values.update(_from_file(path, known))
    for name, default in known.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None and raw.strip():
            values[name] = _typed(name, raw, default, ENV_PREFIX + name.upper())
    own = {f.name for f in fields(cls)}
    return cls(**{name: value for name, value in values.items() if name in own})

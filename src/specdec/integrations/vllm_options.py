"""Options of the vLLM proposers, read from the environment and an optional JSON file.

Why this channel: vLLM builds a `custom_class` proposer as `Class(vllm_config)`
and its `speculative_config` schema is fixed (method, model,
num_speculative_tokens, ...), so a proposer's own options cannot travel in it.
They come instead from

1. `SPECDEC_VLLM_CONFIG=/path/options.json`: one JSON object, e.g.
   `{"k": 60, "node_cost": 0.05}`;
2. `SPECDEC_VLLM_<NAME>` environment variables (`SPECDEC_VLLM_K=30`), which
   override the file;
3. the defaults: those of the method configs the options come from
   (`derived_config`: k, max_ngram, prefer, min_ngram are declared, with
   their bounds, once, in `LogitSpecConfig` and `PLDConfig`).

The draft length is vLLM's own `num_speculative_tokens`.

Invariants: options are frozen configs validated when the proposer is built,
with the same messages as the command line and the server,
so a bad value stops vLLM at startup with a one-line message, never mid-serving;
a key that no specdec vLLM proposer knows is an error (a typo must not be
silently ignored); keys of the other proposer are ignored, so one file can hold
both proposers' options.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from specdec.proposers.logitspec import LogitSpecConfig
from specdec.proposers.pld import PLDConfig, check_min_ngram
from specdec.proposers.schema import MethodError, derived_config, method_config, option, option_specs

ENV_PREFIX = "SPECDEC_VLLM_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


@method_config("logitspec")
class _ChainPricing:
    """vLLM's LogitSpec only (chain mode).

    node_cost: what one more draft token costs, as a share of a decoding step's
      expected gain of one token: a chain keeps a token while its chance of being
      accepted exceeds this (0 = the longest most promising chain);
    measure_cost: price draft tokens by the engine's measured steps
      (`step_cost.StepCost`: the seconds a carried token adds, at the current
      tokens per second) once enough steps are seen; node_cost until then, and
      always when false.
    """

    node_cost: Annotated[float, option(ge=0.0, lt=1.0)] = 0.05
    measure_cost: bool = True


# LogitSpec in chain mode: k, max_ngram and prefer as declared by LogitSpecConfig, then the pricing
LogitSpecOptions = derived_config(
    "LogitSpecOptions", __name__, LogitSpecConfig, ("k", "max_ngram", "prefer"), _ChainPricing
)
# Prompt lookup (transformers' semantics): max_ngram, min_ngram and prefer as declared by PLDConfig
PromptLookupOptions = derived_config(
    "PromptLookupOptions", __name__, PLDConfig, ("max_ngram", "min_ngram", "prefer"),
    post_init=lambda self: check_min_ngram(self.min_ngram, self.max_ngram),
)  # fmt: skip
OPTION_CLASSES = (LogitSpecOptions, PromptLookupOptions)


def _parse(cls: type, name: str, raw: Any, source: str) -> Any:
    """`raw` as option `name` of `cls` (the schema's rules and message), or ValueError naming `source`."""
    try:
        return option_specs(cls)[name].parse(raw)
    except MethodError as error:
        raise ValueError(f"{source}: {error}") from None


def _from_file(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{CONFIG_ENV}={path}: cannot read a JSON object ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{CONFIG_ENV}={path}: must hold one JSON object, got {type(data).__name__}")
    known = {name for cls in OPTION_CLASSES for name in option_specs(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{CONFIG_ENV}={path}: unknown options {unknown}; known: {sorted(known)}")
    return data


def read_options(cls: type, environ: Mapping[str, str] | None = None) -> Any:
    """An instance of `cls` (LogitSpecOptions or PromptLookupOptions): file, then environment, then defaults."""
    environ = os.environ if environ is None else environ
    path = environ.get(CONFIG_ENV, "").strip()
    from_file = _from_file(path) if path else {}
    values = {
        name: _parse(cls, name, raw, path) for name, raw in from_file.items() if name in option_specs(cls)
    }
    for name in option_specs(cls):
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None and raw.strip():
            values[name] = _parse(cls, name, raw, ENV_PREFIX + name.upper())
    try:
        return cls(**values)
    except MethodError as error:  # options that do not fit together
        raise ValueError(f"{path or 'environment'}: {error}") from None

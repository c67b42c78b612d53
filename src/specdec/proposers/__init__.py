"""The method registry: every drafting method by name, with its options.

A method is a frozen config (its fields are the method's options, declared once
with their bounds in `specdec.proposers.schema`, with defaults that work) whose
`build(loaded_model)` returns a fresh `Proposer`.
Methods are named here and imported lazily, so `specdec --help` stays fast and a
method's heavy dependencies load only when it is used.

A method string is `name` or `name:opt=value,opt=value` (as on the command line,
in the benchmark and in server requests); unknown names, unknown options and
values of the wrong type are refused with a message that lists what is allowed.
"""

from __future__ import annotations

import importlib
from typing import Any

from specdec.proposers.schema import MethodError, parse_options

__all__ = [
    "METHODS", "MethodError", "make_config", "method_config_class", "method_name", "parse_method", "split_method",
]

# name -> "module:ConfigClass"
METHODS: dict[str, str] = {
    "plain": "specdec.proposers.plain:PlainConfig",
    "pld": "specdec.proposers.pld:PLDConfig",
    "logitspec": "specdec.proposers.logitspec.proposer:LogitSpecConfig",
    "draft": "specdec.proposers.draft:DraftConfig",
    "layerskip": "specdec.proposers.layerskip:LayerSkipConfig",
    "lookahead": "specdec.proposers.lookahead:LookaheadConfig",
    "recycle": "specdec.proposers.recycle:RecycleConfig",
    "datastore": "specdec.proposers.datastore_lookup:DatastoreConfig",
    "session": "specdec.proposers.session_store:SessionConfig",
    "hybrid": "specdec.proposers.hybrid:HybridConfig",
    "eagle": "specdec.proposers.eagle.proposer:EagleConfig",
    "medusa": "specdec.proposers.medusa.proposer:MedusaConfig",
    "hydra": "specdec.proposers.hydra.proposer:HydraConfig",
}


def method_config_class(name: str) -> type:
    if name not in METHODS:
        raise MethodError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    module_name, class_name = METHODS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make_config(name: str, options: dict[str, Any] | None = None) -> Any:
    """The config of method `name` with `options` (strings or typed values) applied and validated."""
    cls = method_config_class(name)
    return cls(**parse_options(cls, options or {}))  # rules across options: MethodError from the config


def split_method(spec: str) -> tuple[str, dict[str, str]]:
    """`logitspec:k=60,budget=32` -> ("logitspec", {"k": "60", "budget": "32"})."""
    name, _, rest = spec.strip().partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise MethodError(f"{name}: options look like key=value, got {item!r}")
        if key.strip() in options:  # never "the last one wins": the spec says two things
            raise MethodError(f"{name}: option {key.strip()!r} is given twice")
        options[key.strip()] = value.strip()
    return name.strip(), options


def parse_method(spec: str, extra: dict[str, Any] | None = None) -> Any:
    """The validated config for a method string, with `extra` options on top."""
    name, options = split_method(spec)
    return make_config(name, {**options, **(extra or {})})


def method_name(config: Any) -> str:
    for name, target in METHODS.items():
        if target.endswith(":" + type(config).__name__) and target.startswith(type(config).__module__):
            return name
    raise MethodError(f"{type(config).__name__} is not a registered method config")

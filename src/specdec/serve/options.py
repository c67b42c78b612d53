"""Which method options a request may set, within which bounds, and the server's own settings for the rest.

Why: a method's options include things no client may touch: paths the server
would load, convert or write into (`draft_model`, `cache_dir`, `costs_dir`) and
settings that make the server spend its time converting, measuring or
calibrating (`quantize`, layerskip's `skip` and `verify_cost`). So each
method's options are split in two:

- request options (`REQUEST_OPTIONS`): a request may set them, in the method
  string (`"logitspec:k=10"`) or in `specdec.options`, each typed and bounded;
- server-side options: every other option of the method (deny by default, so an
  option added to a config later is server-side until it is listed here). They
  are set by `specdec serve --method SPEC` (for its method) and the repeatable
  `--method-config METHOD:opt=value,...`, else they keep the method's defaults.

Invariants:
- a request's config is `make_config(name, {**server-side settings, **request options})`
  and is made only after every request option passed its check, so no config a
  request could not legally ask for is ever made (let alone built);
- a refusal is a `RequestRefused` naming the option (or method) and what is
  allowed, with an OpenAI error `param` and `code`; nothing here raises anything else;
- a request with no `specdec` field gets exactly the server's default config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from specdec.proposers import METHODS, MethodError, make_config, method_config_class, split_method
from specdec.proposers.chain_length import SCHEDULES
from specdec.proposers.pld import PREFER_CHOICES

TRUE_WORDS = frozenset({"true", "1", "yes"})
FALSE_WORDS = frozenset({"false", "0", "no"})


class RequestRefused(ValueError):
    """A request's method or option is refused; `param` and `code` are OpenAI error fields."""

    def __init__(self, message: str, param: str, code: str) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class IntOption:
    """An integer in [low, high]; JSON integers, integral floats and decimal strings are accepted."""

    low: int
    high: int

    def parse(self, raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError("a boolean is not an integer")
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        value = int(raw.strip()) if isinstance(raw, str) else raw
        if not isinstance(value, int):
            raise ValueError(f"{raw!r} is not an integer")
        if not self.low <= value <= self.high:
            raise ValueError(f"{value} is out of bounds")
        return value

    def describe(self) -> str:
        return f"an integer in [{self.low}, {self.high}]"


@dataclass(frozen=True)
class FloatOption:
    """A finite number in [low, high]."""

    low: float
    high: float

    def parse(self, raw: Any) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise ValueError(f"{raw!r} is not a number")
        value = float(raw)
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise ValueError(f"{raw!r} is out of bounds")
        return value

    def describe(self) -> str:
        return f"a number in [{self.low:g}, {self.high:g}]"


@dataclass(frozen=True)
class ChoiceOption:
    """One of a few strings."""

    choices: tuple[str, ...]

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str) or raw.strip() not in self.choices:
            raise ValueError(f"{raw!r} is not a choice")
        return raw.strip()

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)


@dataclass(frozen=True)
class FlagOption:
    """A boolean: JSON true/false, or the strings true/false/1/0/yes/no (method strings)."""

    def parse(self, raw: Any) -> bool:
        if isinstance(raw, bool):
            return raw
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise ValueError(f"{raw!r} is not a boolean")

    def describe(self) -> str:
        return "true or false"


Option = IntOption | FloatOption | ChoiceOption | FlagOption
CHAIN_OPTIONS: dict[str, Option] = {
    "k": IntOption(1, 16),
    "max_k": IntOption(1, 16),
    "adaptive": FlagOption(),
    "schedule": ChoiceOption(SCHEDULES),
}
# What a request may set, per method. Bounds keep every request's work per step small
# (tree sizes, draft lengths, n-gram sizes).
REQUEST_OPTIONS: dict[str, dict[str, Option]] = {
    "plain": {},
    "pld": {
        "max_ngram": IntOption(1, 5),
        "min_ngram": IntOption(1, 5),
        "num_pred_tokens": IntOption(1, 20),
        "prefer": ChoiceOption(PREFER_CHOICES),
    },
    "logitspec": {
        "k": IntOption(0, 100),
        "budget": IntOption(1, 64),
        "max_ngram": IntOption(1, 5),
        "max_continuation": IntOption(1, 20),
        "prefer": ChoiceOption(PREFER_CHOICES),
        "adaptive": FlagOption(),
        "min_gain": FloatOption(0.0, 10.0),
        "floor": FlagOption(),
        "third": FlagOption(),
        "recycle": FlagOption(),
        "session": FlagOption(),  # the store's size is server-side (the `session` method's); datastore: a path
    },
    "draft": dict(CHAIN_OPTIONS),
    "hybrid": {
        "k": IntOption(0, 100),
        "budget": IntOption(1, 64),
        "max_k": IntOption(1, 16),
        "schedule": ChoiceOption(SCHEDULES),
        "when": ChoiceOption(("weak", "always")),
    },
    "layerskip": dict(CHAIN_OPTIONS),
    "lookahead": {
        "window": IntOption(1, 8),
        "ngram": IntOption(2, 6),
        "guesses": IntOption(0, 8),
        "pool_size": IntOption(1, 16),
        "max_nodes": IntOption(2, 64),
    },
    "recycle": {  # the successor table's width k: one table per k and model, so k is bounded tightly
        "k": IntOption(1, 16),
        "budget": IntOption(1, 96),
        "max_depth": IntOption(1, 8),
    },
    "datastore": {  # the datastore folder is server-side: --method-config datastore:path=DIR
        "max_ngram": IntOption(1, 16),
        "min_ngram": IntOption(1, 16),
        "max_continuation": IntOption(1, 20),
        "max_branches": IntOption(1, 8),
        "budget": IntOption(1, 64),
    },
    "session": {  # the store's size and n-gram width (max_tokens, max_ngram) are server-side
        "min_ngram": IntOption(1, 4),
        "num_pred_tokens": IntOption(1, 20),
    },
}


def option_names(name: str) -> list[str]:
    """Every option of method `name` (its config's fields)."""
    return [field.name for field in fields(method_config_class(name))]


def check_option(name: str, option: str, raw: Any, param: str) -> Any:
    """The typed value of one request option, or RequestRefused naming it."""
    allowed = REQUEST_OPTIONS.get(name, {})
    listing = ", ".join(sorted(allowed)) or "none"
    if option not in allowed:
        why = "is set by the server, not by requests" if option in option_names(name) else "is not an option"
        message = f"{name}: option {option!r} {why}; a request may set: {listing}"
        raise RequestRefused(message, param, "option_not_allowed")
    bound = allowed[option]
    try:
        return bound.parse(raw)
    except (ValueError, TypeError, OverflowError):
        text = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:40] + "..."
        message = f"{name}: option {option!r} must be {bound.describe()}, got {text}"
        raise RequestRefused(message, param, "invalid_value") from None


@dataclass(frozen=True)
class Resolved:
    """What a request asked for: the method, its full config, and the options a request may see."""

    name: str
    config: Any
    visible: dict[str, Any]  # the config's request options (server-side values, paths included, stay out)


@dataclass(frozen=True)
class MethodSettings:
    """The server's default method and its server-side option values per method (from the command line)."""

    default: str
    settings: Mapping[str, Mapping[str, str]]

    @classmethod
    def from_specs(cls, default_spec: str, method_configs: Sequence[str] = ()) -> MethodSettings:
        """`--method` and `--method-config` values -> settings; MethodError for any bad one.

        Options of `--method-config M:...` are merged in order, then `--method`'s own
        options on top for its method. Every method named is checked to make a config.
        """
        settings: dict[str, dict[str, str]] = {}
        for spec in [*method_configs, default_spec]:
            name, options = split_method(spec)
            settings.setdefault(name, {}).update(options)
        for name, options in settings.items():
            make_config(name, options)  # unknown method, option or value: fail now, at startup
        default = split_method(default_spec)[0]
        return cls(default, settings)

    @property
    def configured(self) -> tuple[str, ...]:
        """The methods the server was told about (default first): those it prepares at startup."""
        return (self.default, *sorted(set(self.settings) - {self.default}))

    def server_config(self, name: str) -> Any:
        return make_config(name, dict(self.settings.get(name, {})))

    def resolve(self, method: str | None, options: Mapping[str, Any] | None) -> Resolved:
        """The config for a request's `specdec.method` / `specdec.options` (both may be absent)."""
        name, from_spec = self.default, {}
        if method:
            try:
                name, from_spec = split_method(method)
            except MethodError as error:
                raise RequestRefused(str(error), "specdec.method", "invalid_method") from None
        if name not in METHODS:
            known = ", ".join(sorted(METHODS))
            raise RequestRefused(
                f"unknown method {name!r}; known methods: {known}", "specdec.method", "invalid_method"
            )
        asked = {key: check_option(name, key, raw, "specdec.method") for key, raw in from_spec.items()}
        for key, raw in (options or {}).items():
            asked[key] = check_option(name, key, raw, "specdec.options")
        try:
            config = make_config(name, {**self.settings.get(name, {}), **asked})
        except MethodError as error:  # options that do not fit together, e.g. k > max_k
            raise RequestRefused(str(error), "specdec.options", "invalid_value") from None
        if getattr(config, "draft_model", None) == "":  # refused here, before a stream has started
            raise RequestRefused(
                f"{name}: this server has no draft model; start it with --method-config {name}:draft_model=NAME",
                "specdec.method",
                "method_not_available",
            )
        visible = {key: getattr(config, key) for key in REQUEST_OPTIONS.get(name, {})}
        return Resolved(name, config, visible)

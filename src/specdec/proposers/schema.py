"""Method options, declared once: a method's config class is the schema of its options.

Why: each option used to be declared in its config (with hand-written checks),
again in the server's request allowlist and again in the vLLM options, each
with its own bounds. Now a config is a frozen pydantic dataclass whose fields
are `Annotated[type, option(...)]`: the type (int, float, bool, str, or a
`Literal` of choices), the bounds, and whether a request may set it (and up
to what). The `name:key=value` parser, the server's request checks, the
`specdec methods` listing and the vLLM options all read `option_specs(cls)`.

Invariants:
- one message per bad value, whatever the channel (command line, request,
  vLLM environment): "METHOD: option NAME must be BOUND, got VALUE";
- configs are hashable, compare by value, and are validated on every
  construction (`dataclasses.replace` included); a bad value raises
  `MethodError` (a ValueError), never pydantic's own error;
- rules across options that a bound cannot express stay in the config's
  `__post_init__` (a ValueError there becomes "METHOD: its message");
- a config whose build is expensive (loads a model, measures, calibrates, opens a folder) says so in
  its own `preparation()` (a `Preparation`, keyed by server-side options only, so a request cannot
  make a server do that work); every other config gets the decorator's `preparation()`, None.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

# strict: values are converted from text by `OptionSpec.parse` (one set of rules for every channel)
PYDANTIC_CONFIG = ConfigDict(strict=True, allow_inf_nan=False)
WORDS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}
KIND_TEXT = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}


class MethodError(ValueError):
    """An unknown method, an unknown option, or a bad option value."""


def option(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    request: bool = False,
    request_max: float | None = None,
) -> Any:
    """An option's bounds, and whether a request may set it (`request_max`: a request's tighter cap)."""
    extra = {"request": request or request_max is not None, "request_max": request_max}
    return Field(ge=ge, gt=gt, le=le, lt=lt, json_schema_extra=extra)


@dataclass(frozen=True)
class Preparation:
    """The expensive part of a config's build, split from the cheap part so a server does it once.

    `prepare(loaded)` makes the parts (startup only: may load, convert, measure or calibrate);
    `assemble(loaded, parts)` makes a fresh proposer from them and never does that work. `key` names
    the parts (configs with equal keys share them) and is made of server-side options only. `missing`
    says why a request for a config whose parts were not prepared is refused, and how an operator fixes it.
    """

    key: Hashable
    prepare: Callable[[Any], Any]
    assemble: Callable[[Any, Any], Any]
    missing: str


def _no_preparation(self: Any) -> Preparation | None:
    """This method's build is cheap: `config.build(loaded)` serves every request."""
    return None


def method_config(label: str) -> Callable[[type], type]:
    """Make `cls` a frozen, validated method config whose errors are MethodErrors naming `label`."""

    def wrap(cls: type) -> type:
        made = pydantic_dataclass(frozen=True, config=PYDANTIC_CONFIG)(cls)
        made.method_label = label
        if not hasattr(made, "preparation"):
            made.preparation = _no_preparation
        validate = made.__init__

        @functools.wraps(validate)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                validate(self, *args, **kwargs)
            except ValidationError as error:
                raise MethodError(_message(made, error)) from None

        made.__init__ = __init__
        return made

    return wrap


def _message(cls: type, error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    if first["loc"] and first["loc"][0] in option_specs(cls):
        return option_specs(cls)[first["loc"][0]].refusal(first["input"])
    cause = first.get("ctx", {}).get("error", first["msg"])  # a ValueError from __post_init__
    text = str(cause)
    return text if text.startswith(cls.method_label + ":") else f"{cls.method_label}: {text}"


def _number(value: float) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class OptionSpec:
    """One option as declared: what the parser, the server, the help and vLLM read."""

    method: str
    name: str
    kind: type  # int, float, bool or str
    choices: tuple[str, ...]
    default: Any
    low: tuple[str, float] | None  # (">=", 0) or (">", 0)
    high: tuple[str, float] | None  # ("<=", 8) or ("<", 1)
    request: bool
    request_max: float | None
    adapter: TypeAdapter = None  # the declared type with its bounds, for one value

    def bound_text(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.low and self.high:
            opening, closing = "[" if self.low[0] == ">=" else "(", "]" if self.high[0] == "<=" else ")"
            return f"in {opening}{_number(self.low[1])}, {_number(self.high[1])}{closing}"
        bound = self.low or self.high
        return f"{bound[0]} {_number(bound[1])}" if bound else KIND_TEXT[self.kind]

    def describe(self) -> str:
        """What the help shows: 'an integer >= 0', 'one of latest, earliest', 'true or false'."""
        if self.choices or self.kind in (bool, str) or not (self.low or self.high):
            return self.bound_text()
        return f"{KIND_TEXT[self.kind]} {self.bound_text()}"

    def refusal(self, value: Any) -> str:
        return f"{self.method}: option {self.name} must be {self.bound_text()}, got {value!r}"

    def parse(self, raw: Any, *, in_request: bool = False) -> Any:
        """`raw` (text, or a JSON value) as this option's value, within its bounds; MethodError if not."""
        value = self._typed(raw)
        try:
            self.adapter.validate_python(value)
        except ValidationError:
            raise MethodError(self.refusal(value)) from None
        if in_request and self.request_max is not None and value > self.request_max:
            raise MethodError(
                f"{self.method}: option {self.name} must be <= {_number(self.request_max)} in a request, got {value!r}"
            )
        return value

    def _typed(self, raw: Any) -> Any:
        text = raw.strip() if isinstance(raw, str) else None
        try:
            if self.kind is bool:
                value = raw if isinstance(raw, bool) else WORDS[text.lower()] if text is not None else None
            elif self.kind is int:
                value = int(text) if text is not None else _integral(raw)
            elif self.kind is float:
                value = float(text) if text is not None else _real(raw)
            else:
                value = text
        except (ValueError, KeyError, OverflowError):
            value = None
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            shown = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:40] + "..."
            raise MethodError(
                f"{self.method}: option {self.name} must be {KIND_TEXT[self.kind]}, got {shown}"
            )
        return value


def _integral(raw: Any) -> int | None:
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _real(raw: Any) -> float | None:
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None


@functools.cache
def option_specs(cls: type) -> dict[str, OptionSpec]:
    """The options of a `method_config` class, in declaration order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    specs = {}
    for name, info in cls.__pydantic_fields__.items():
        literal = typing.get_origin(info.annotation) is Literal
        choices = tuple(typing.get_args(info.annotation)) if literal else ()
        low = high = None
        for bound in info.metadata:
            if isinstance(bound, annotated_types.Ge | annotated_types.Gt):
                low = (">=", bound.ge) if isinstance(bound, annotated_types.Ge) else (">", bound.gt)
            elif isinstance(bound, annotated_types.Le | annotated_types.Lt):
                high = ("<=", bound.le) if isinstance(bound, annotated_types.Le) else ("<", bound.lt)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        specs[name] = OptionSpec(
            cls.method_label,
            name,
            str if literal else info.annotation,
            choices,
            info.default,
            low,
            high,
            bool(extra.get("request")),
            extra.get("request_max"),
            TypeAdapter(hints[name], config=PYDANTIC_CONFIG),
        )
    return specs


def parse_options(cls: type, options: dict[str, Any], *, in_request: bool = False) -> dict[str, Any]:
    """Typed values for `options` of `cls` (text or JSON values); MethodError naming any unknown or bad one."""
    specs = option_specs(cls)
    typed = {}
    for name, raw in options.items():
        if name not in specs:
            allowed = ", ".join(sorted(specs)) or "none"
            raise MethodError(f"{cls.method_label}: unknown option {name!r}; options: {allowed}")
        typed[name] = specs[name].parse(raw, in_request=in_request)
    return typed


def derived_config(
    name: str,
    module: str,
    source: type,
    options: Sequence[str],
    extra: type | None = None,
    post_init: Callable[[Any], None] | None = None,
) -> type:
    """A config of some of `source`'s options (their types, bounds and defaults), then all of `extra`'s.

    Why: another surface over options declared once (vLLM's options are LogitSpec's and
    prompt lookup's, plus a few of vLLM's own); `post_init` holds its rules across options.
    """
    annotations, namespace = {}, {"__module__": module, "__qualname__": name}
    for cls, names in ((source, options), (extra, list(extra.__pydantic_fields__) if extra else [])):
        hints = typing.get_type_hints(cls, include_extras=True) if cls else {}
        for option_name in names:
            annotations[option_name] = hints[option_name]
            namespace[option_name] = cls.__pydantic_fields__[option_name].default
    namespace["__annotations__"] = annotations
    if post_init is not None:
        namespace["__post_init__"] = post_init
    return method_config(source.method_label)(type(name, (), namespace))


def option_lines(cls: type) -> list[str]:
    """One help line per option of `cls`: name, what it may be, default, and who may set it."""
    lines = []
    for spec in option_specs(cls).values():
        if spec.request_max is not None:
            who = f"requests: <= {_number(spec.request_max)}"
        else:
            who = "requests too" if spec.request else "server/command line only"
        lines.append(f"  {spec.name:<18} {spec.describe():<34} default {spec.default!r:<10} {who}")
    return lines

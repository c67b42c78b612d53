"""Which method options a request may set, within which bounds, and the server's own settings for the rest.

Why: a method's options include things no client may touch: paths the server
would load, convert or write into (`draft_model`, `cache_dir`, `costs_dir`) and
settings that make the server spend its time converting, measuring or
calibrating (`quantize`, layerskip's `skip` and `verify_cost`). So each
method's options are split in two:

- request options (`REQUEST_OPTIONS`, derived from the configs: the options
  declared with `option(request=True)` or a `request_max` cap, see
  `specdec.proposers.schema`): a request may set them, in the method string
  (`"logitspec:k=10"`) or in `specdec.options`, each typed and bounded;
- server-side options: every other option of the method (deny by default, so an
  option added to a config later is server-side until declared otherwise). They
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.proposers import METHODS, MethodError, make_config, method_config_class, split_method
from specdec.proposers.schema import OptionSpec, option_specs


class RequestRefused(ValueError):
    """A request's method or option is refused; `param` and `code` are OpenAI error fields."""

    def __init__(self, message: str, param: str, code: str) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


# What a request may set, per method: the options its config declares with `request` (and a cap)
REQUEST_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    name: {option: spec for option, spec in option_specs(method_config_class(name)).items() if spec.request}
    for name in METHODS
}


def check_option(name: str, option: str, raw: Any, param: str) -> Any:
    """The typed value of one request option, or RequestRefused naming it."""
    allowed = REQUEST_OPTIONS.get(name, {})
    if option not in allowed:
        known = option in option_specs(method_config_class(name))
        why = "is set by the server, not by requests" if known else "is not an option"
        listing = ", ".join(sorted(allowed)) or "none"
        message = f"{name}: option {option!r} {why}; a request may set: {listing}"
        raise RequestRefused(message, param, "option_not_allowed")
    try:
        return allowed[option].parse(raw, in_request=True)
    except MethodError as error:  # the schema's message: the option, its bound, the value
        raise RequestRefused(str(error), param, "invalid_value") from None


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

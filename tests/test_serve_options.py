"""Which method options a request may set (specdec.serve.options), without a model or a server.

What must hold (each test can fail):
- the allowlist names only real options, and never one that names a path or
  triggers a conversion, measurement or calibration;
- every refusal is a RequestRefused naming the option (or method), with the
  OpenAI param and code; the method string and the options object are held to
  the same allowlist and bounds;
- a request's config is the server's settings plus the allowed options, nothing else
  (fuzzed in test_server_fuzz.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from specdec.proposers import METHODS, MethodError, make_config, method_config_class
from specdec.serve.options import REQUEST_OPTIONS, MethodSettings, RequestRefused

SERVER_SIDE = {
    "draft": {"draft_model", "cache_dir", "quantize", "cost_ratio", "verify_cost"},
    "layerskip": {"skip", "cache_dir", "verify_cost"},
    "logitspec": {"costs_dir"},
}
SETTINGS = MethodSettings.from_specs(
    "logitspec:budget=16", ["draft:draft_model=some-draft,cache_dir=/srv/cache", "logitspec:costs_dir=/srv/costs"]
)


def refusal(method: str | None, options: dict[str, Any] | None = None) -> RequestRefused:
    with pytest.raises(RequestRefused) as caught:
        SETTINGS.resolve(method, options)
    return caught.value


# ------------------------------------------------------------------ the allowlist itself
def test_the_allowlist_covers_every_method_and_names_only_real_options():
    assert set(REQUEST_OPTIONS) == set(METHODS)
    for name, allowed in REQUEST_OPTIONS.items():
        fields = {field.name for field in dataclasses.fields(method_config_class(name))}
        assert set(allowed) <= fields, name
        assert not set(allowed) & SERVER_SIDE.get(name, set()), name
        assert not any("dir" in option or "model" in option or "path" in option for option in allowed), name


def test_every_allowed_default_is_within_its_bounds():
    """A request that sets an option to its own default is never refused."""
    for name, allowed in REQUEST_OPTIONS.items():
        defaults = make_config(name)
        for option, bound in allowed.items():
            value = getattr(defaults, option)
            assert bound.parse(value, in_request=True) == value, (name, option)


def test_every_number_a_request_may_set_is_capped():
    for name, allowed in REQUEST_OPTIONS.items():
        for option, spec in allowed.items():
            if spec.kind in (int, float):
                assert spec.low is not None and spec.request_max is not None, (name, option)


@pytest.mark.parametrize(
    ("option", "good", "bad"),  # logitspec's: budget in [1, 64] for requests, min_gain in [0, 10], ...
    [
        ("budget", [1, 64, "7", " 8 ", 9.0], [0, 65, -1, 10**30, True, "x", "", 2.5, None, [3]]),
        ("min_gain", [0, 10, "2.5", 0.1], ["nan", "inf", float("nan"), -0.1, 11, True, None, "x"]),
        ("prefer", ["latest", " earliest"], ["first", 1, None, True]),
        ("adaptive", [True, False, "true", "No", "1", "0"], [1, 0, "maybe", None, 2.0]),
    ],
)
def test_bounds_accept_and_refuse(option, good, bad):
    bound = REQUEST_OPTIONS["logitspec"][option]
    for value in good:
        bound.parse(value, in_request=True)
    for value in bad:
        with pytest.raises((ValueError, TypeError)):
            bound.parse(value, in_request=True)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("method", "options", "option"),
    [
        ("draft", {"draft_model": "/etc"}, "draft_model"),
        ("draft", {"cache_dir": "/tmp/x"}, "cache_dir"),
        ("draft", {"quantize": "int8"}, "quantize"),
        ("logitspec", {"costs_dir": "/tmp/x"}, "costs_dir"),
        ("layerskip", {"skip": "1+2"}, "skip"),
        ("layerskip", {"cache_dir": "/"}, "cache_dir"),
        (None, {"costs_dir": "/tmp"}, "costs_dir"),  # the default method's options
    ],
)
def test_server_side_options_are_refused_naming_the_option(method, options, option):
    error = refusal(method, options)
    assert (error.param, error.code) == ("specdec.options", "option_not_allowed")
    assert repr(option) in str(error) and "set by the server" in str(error)


@pytest.mark.parametrize(
    ("method", "option"),
    [("logitspec:costs_dir=/tmp", "costs_dir"), ("draft:draft_model=/etc", "draft_model"), ("pld:x=1", "x")],
)
def test_options_in_the_method_string_go_through_the_same_allowlist(method, option):
    error = refusal(method)
    assert (error.param, error.code) == ("specdec.method", "option_not_allowed")
    assert repr(option) in str(error)


@pytest.mark.parametrize(
    ("method", "options", "option"),
    [
        ("logitspec", {"budget": 1000}, "budget"),
        ("logitspec:budget=1000", None, "budget"),
        ("logitspec", {"budget": 0}, "budget"),
        ("logitspec", {"k": 101}, "k"),
        ("logitspec", {"max_ngram": 6}, "max_ngram"),
        ("logitspec", {"min_gain": "nan"}, "min_gain"),
        ("logitspec", {"adaptive": "maybe"}, "adaptive"),
        ("pld", {"num_pred_tokens": 21}, "num_pred_tokens"),
        ("pld", {"prefer": "middle"}, "prefer"),
        ("lookahead", {"max_nodes": 10**6}, "max_nodes"),
        ("draft", {"k": True}, "k"),
    ],
)
def test_out_of_bounds_values_are_refused_naming_the_option(method, options, option):
    error = refusal(method, options)
    assert error.code == "invalid_value" and error.param.startswith("specdec.")
    assert f"option {option} must be" in str(error)


def test_unknown_methods_malformed_strings_and_clashing_options_are_refused():
    assert refusal("no-such-method").code == "invalid_method"
    assert refusal("logitspec:novalue").param == "specdec.method"
    assert refusal("logitspec", {"no_such_option": 1}).code == "option_not_allowed"
    clash = refusal("pld", {"min_ngram": 4, "max_ngram": 2})  # each in bounds, not together
    assert (clash.param, clash.code) == ("specdec.options", "invalid_value")


def test_an_option_given_twice_in_a_method_string_is_refused():
    twice = refusal("logitspec:k=1,k=2")  # not "the last one wins"
    assert (twice.param, twice.code) == ("specdec.method", "invalid_method") and "'k' is given twice" in str(twice)
    with pytest.raises(MethodError, match="given twice"):  # the CLI's --method and --method-config too
        MethodSettings.from_specs("logitspec:budget=8,budget=16")


# ------------------------------------------------------------------ what a request gets
def test_no_specdec_field_gets_the_server_default_exactly():
    resolved = SETTINGS.resolve(None, None)
    assert resolved.name == "logitspec"
    assert resolved.config == make_config("logitspec", {"budget": "16", "costs_dir": "/srv/costs"})
    assert "costs_dir" not in resolved.visible and resolved.visible["budget"] == 16


def test_request_options_go_on_top_of_the_server_settings():
    resolved = SETTINGS.resolve("draft:k=3", {"max_k": 5, "adaptive": "false"})
    assert resolved.config.draft_model == "some-draft" and resolved.config.cache_dir == "/srv/cache"
    assert (resolved.config.k, resolved.config.max_k, resolved.config.adaptive) == (3, 5, False)
    assert set(resolved.visible) == set(REQUEST_OPTIONS["draft"])


def test_server_settings_are_checked_at_startup_and_merged():
    with pytest.raises(MethodError):
        MethodSettings.from_specs("logitspec", ["logitspec:no_such=1"])
    with pytest.raises(MethodError):
        MethodSettings.from_specs("nothing")
    merged = MethodSettings.from_specs("logitspec:k=5", ["logitspec:k=9,budget=8", "layerskip:skip=3+4"])
    assert merged.settings["logitspec"] == {"k": "5", "budget": "8"}  # --method's own options win
    assert merged.configured == ("logitspec", "layerskip")

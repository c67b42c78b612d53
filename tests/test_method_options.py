"""Each method option is declared once (specdec.proposers.schema); every channel refuses a bad value alike.

What must hold (each test can fail):
- every bound an option declares refuses a value just past it, with one message
  ("METHOD: option NAME must be BOUND, got VALUE"), word for word, on the command
  line (`specdec generate --method`), in the server's request checks (or its
  `--method-config` settings, for options only the server may set) and in the
  vLLM options that take the option from the same config;
- the cases come from the declarations themselves, so an option added later is covered;
- a request's cap refuses what the command line may still set;
- configs stay hashable, equal by value, and validated by `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses

import pytest

from specdec.cli import main
from specdec.integrations.vllm_options import ENV_PREFIX, OPTION_CLASSES, read_options
from specdec.proposers import METHODS, MethodError, make_config, method_config_class, parse_method
from specdec.proposers.schema import OptionSpec, option_specs
from specdec.serve.options import MethodSettings, RequestRefused

SETTINGS = MethodSettings.from_specs("plain")


def past_bounds(spec: OptionSpec) -> list:
    """One value just past each bound the option declares."""
    step = 1 if spec.kind is int else 0.5
    values = [f"bogus-{spec.name}"] if spec.choices else []
    if spec.low:
        values.append(spec.low[1] - step if spec.low[0] == ">=" else spec.low[1])
    if spec.high:
        values.append(spec.high[1] + step if spec.high[0] == "<=" else spec.high[1])
    return values


def method_cases() -> list:
    return [
        pytest.param(name, spec, value, id=f"{name}.{spec.name}={value}")
        for name in METHODS
        for spec in option_specs(method_config_class(name)).values()
        for value in past_bounds(spec)
    ]


def vllm_cases() -> list:
    return [
        pytest.param(cls, spec, value, id=f"{cls.__name__}.{spec.name}={value}")
        for cls in OPTION_CLASSES
        for spec in option_specs(cls).values()
        for value in past_bounds(spec)
    ]


def vllm_classes_with(name: str, option: str) -> list[type]:
    """The vLLM option classes that take `option` from method `name`'s config."""
    return [cls for cls in OPTION_CLASSES if cls.method_label == name and option in option_specs(cls)]


def test_the_cases_come_from_the_declarations():
    ids = {case.id for case in method_cases()}
    assert {"logitspec.k=-1", "pld.prefer=bogus-prefer", "draft.fill=65", "lookahead.ngram=1"} <= ids
    assert len(ids) >= 40  # every bounded option of every method


@pytest.mark.parametrize(("name", "spec", "value"), method_cases())
def test_a_value_past_a_bound_gets_one_message_everywhere(name, spec, value, capsys):
    expected = f"{name}: option {spec.name} must be {spec.bound_text()}, got {value!r}"
    spec_string = f"{name}:{spec.name}={value}"
    with pytest.raises(MethodError) as parsed:
        parse_method(spec_string)
    assert str(parsed.value) == expected
    assert main(["generate", "hi", "--model", "/no/such/model", "--method", spec_string]) == 2
    assert capsys.readouterr().err.strip() == f"specdec: error: {expected}"
    if spec.request:
        for method, options in ((spec_string, None), (name, {spec.name: value})):
            with pytest.raises(RequestRefused) as refused:
                SETTINGS.resolve(method, options)
            assert (str(refused.value), refused.value.code) == (expected, "invalid_value")
    else:
        with pytest.raises(MethodError) as configured:
            MethodSettings.from_specs("plain", [spec_string])
        assert str(configured.value) == expected
    for cls in vllm_classes_with(name, spec.name):
        variable = ENV_PREFIX + spec.name.upper()
        with pytest.raises(ValueError) as read:
            read_options(cls, {variable: str(value)})
        assert str(read.value) == f"{variable}: {expected}"


@pytest.mark.parametrize(("cls", "spec", "value"), vllm_cases())
def test_vllm_options_refuse_a_value_past_a_bound(cls, spec, value):
    variable = ENV_PREFIX + spec.name.upper()
    with pytest.raises(ValueError) as read:
        read_options(cls, {variable: str(value)})
    assert (
        str(read.value)
        == f"{variable}: {cls.method_label}: option {spec.name} must be {spec.bound_text()}, got {value!r}"
    )


def test_vllm_options_share_the_configs_declarations():
    assert vllm_classes_with("logitspec", "k") and vllm_classes_with("pld", "min_ngram")
    for cls in OPTION_CLASSES:
        source = option_specs(method_config_class(cls.method_label))
        for option, spec in option_specs(cls).items():
            if option in source:
                assert (spec.kind, spec.choices, spec.low, spec.high, spec.default) == (
                    source[option].kind, source[option].choices, source[option].low, source[option].high,
                    source[option].default,
                )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        (name, spec)
        for name in METHODS
        for spec in option_specs(method_config_class(name)).values()
        if spec.request_max
    ],
)
def test_a_request_cap_refuses_what_the_command_line_may_set(name, spec):
    over = spec.request_max + (1 if spec.kind is int else 0.5)
    with pytest.raises(RequestRefused, match=f"option {spec.name} must be <= .* in a request") as refused:
        SETTINGS.resolve(name, {spec.name: over})
    assert refused.value.param == "specdec.options"
    assert spec.parse(over) == over  # within the config's own bounds


def test_configs_hash_compare_and_revalidate():
    for name in METHODS:
        assert make_config(name) == make_config(name) and hash(make_config(name)) == hash(make_config(name))
    config = make_config("logitspec", {"k": "7"})
    assert {config: 1}[make_config("logitspec", {"k": 7})] == 1
    assert dataclasses.replace(config, budget=8).budget == 8
    with pytest.raises(MethodError, match="logitspec: option budget must be >= 1, got 0"):
        dataclasses.replace(config, budget=0)
    with pytest.raises(MethodError, match="pld: min_ngram must be in"):  # a rule across options stays
        make_config("pld", {"min_ngram": 4, "max_ngram": 2})


def test_the_methods_listing_comes_from_the_declarations(capsys):
    assert main(["methods", "logitspec", "plain"]) == 0
    out = capsys.readouterr().out
    assert "k                  an integer >= 0" in out and "requests: <= 100" in out
    assert "costs_dir" in out and "server/command line only" in out and "plain  (no options)" in out

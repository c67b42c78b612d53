"""`specdec-hf doctor` (`specdec.doctor`): the machine, the settled path, and a reason beside each setting.

What holds on any machine: each reason's verdict is the value the loader settled (`pack_of`,
`verifies_exactly`), for the settings a user can ask (auto, as asked, another dtype, a model without a
GGUF); the text and the JSON carry every line of the path. What `auto` settles to depends on the CPU,
so the bundled model's own answer is checked for consistency, not for one value.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from specdec.backends.registry import explain, verifies_exactly
from specdec.cli import main
from specdec.doctor import format_report, machine_facts
from specdec.models.state import ModelState


def _verdict(reason: str) -> str:
    return reason.split(":")[0].split(" ")[0]


def _check_consistent(loaded) -> dict[str, str]:  # noqa: ANN001 - LoadedModel
    from specdec.backends.torch.packed import pack_of

    why = explain(loaded)
    assert _verdict(why["pack"]) == pack_of(loaded), why["pack"]
    assert _verdict(why["exact"]) == ("on" if verifies_exactly(loaded) else "off"), why["exact"]
    assert why["kernels"]
    return why


@pytest.mark.parametrize(
    ("changes", "pack", "exact"),
    [
        ({}, "not int4, dtype float32", "off: dtype float32"),
        ({"pack": "off"}, "off: as asked", "off: dtype float32"),
        ({"exact": "off"}, "not int4, exact is off", "off: as asked"),
    ],
    ids=["auto", "pack-off", "exact-off"],
)
def test_each_reason_says_what_was_settled(default_model, changes, pack, exact):
    why = _check_consistent(dataclasses.replace(default_model, state=ModelState(), **changes))
    assert pack in why["pack"] and why["exact"].startswith(exact)


def test_a_model_without_a_gguf_is_told_so(tiny):
    why = _check_consistent(dataclasses.replace(tiny, pack="auto", exact="auto", state=ModelState()))
    assert "no GGUF source" in why["pack"]


def test_machine_facts_name_the_cpu_its_isa_torch_and_the_compiler():
    facts = machine_facts()
    assert set(facts) == {"cpu", "isa", "torch", "compiler", "ninja"}
    assert all(isinstance(value, str) and value for value in facts.values())


def test_the_bundled_models_report_is_consistent_on_this_machine(capsys):
    """The default settings, whatever this CPU settles them to; the text and --json carry the same path."""
    assert main(["doctor", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"machine", "path", "why"}
    assert set(result["why"]) == {"dtype", "pack", "exact", "kernels"}
    text = format_report(result, "smollm2-135m")
    for key in result["path"]:
        assert f"  {key} " in text
    assert result["why"]["dtype"].split(":")[0] in result["path"]["dtype"] or result["why"]["dtype"] == "as asked"


def test_the_text_report_puts_a_reason_beside_each_setting(capsys):
    assert main(["doctor", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine\n") and "path (smollm2-135m)" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "float32" in lines["dtype"] and "as asked" in lines["dtype"]
    assert "<- " in lines["weights"] and "<- " in lines["exact"]

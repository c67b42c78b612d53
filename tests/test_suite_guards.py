"""The suite's own guards.

- A run where every C++ kernel test skipped says so (conftest.py's summary, `helpers.kernel_test_outcomes`).
  The reports are pytest's own `TestReport`s, built for one test id each, as the terminal reporter
  keeps them in its stats.
- The two workers run as `make test` assumes, a test group on one worker. `make test` runs
  `pytest -n 2 --dist loadgroup` and conftest.py makes each test module one group, so a module's
  fixtures (a loaded model, a server, a compiled pass) are built once, on one worker. pytest-xdist
  sends a group to one worker by appending the group to each test's id ("...@group"). Under pytest
  9.2 that append silently stopped taking effect (pytest-xdist#1386): nothing failed, but every
  module was split over both workers, its module fixtures built on both and rebuilt whenever another
  module's tests came between. pyproject.toml keeps pytest below 9.2; the last test here fails if
  the groups are lost again, whatever the cause.
"""

import pytest
from helpers import kernel_test_outcomes
from pytest import TestReport


def report(nodeid: str, outcome: str, reason: str = "") -> TestReport:
    longrepr = (nodeid.split("::")[0], 1, f"Skipped: {reason}") if outcome == "skipped" else None
    return TestReport(nodeid, ("", 0, ""), {}, outcome, longrepr, "call" if outcome == "passed" else "setup")


def test_every_kernel_test_skipped_is_told_apart_from_some_passing():
    skipped = [report("tests/test_q4_kernel.py::test_a", "skipped", "no AVX-512 BF16"),
               report("tests/test_fused.py::test_b", "skipped", "the fused pass needs AVX-512 BF16")]
    other = [report("tests/test_tree.py::test_c", "passed")]
    passed, num_skipped, reasons = kernel_test_outcomes({"passed": other, "skipped": skipped})
    assert (passed, num_skipped) == (0, 2)
    assert reasons == {"Skipped: no AVX-512 BF16", "Skipped: the fused pass needs AVX-512 BF16"}
    ran = {"passed": [*other, report("tests/test_q6_k.py::test_d", "passed")], "skipped": skipped}
    assert kernel_test_outcomes(ran)[:2] == (1, 2)


def test_a_test_carries_its_modules_group_on_the_workers(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith(f"@{request.module.__name__}"), request.node.nodeid

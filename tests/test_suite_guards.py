"""The suite's own guard: a run where every C++ kernel test skipped says so (conftest.py's summary, `helpers.kernel_test_outcomes`).

The reports are pytest's own `TestReport`s, built for one test id each, as the terminal reporter
keeps them in its stats.
"""

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

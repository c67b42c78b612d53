"""Per-source counts in bench rows and the report (specdec.bench.sources), without a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec.bench.sources import difference, markdown, snapshot, source_table


def test_snapshot_and_difference_follow_a_proposer_over_one_generation():
    proposer = SimpleNamespace(source_stats={"pld": {"offered": 10, "accepted": 4}, "cand": {"offered": 2, "accepted": 0}})
    before = snapshot(proposer)
    proposer.source_stats["pld"]["offered"] += 5
    proposer.source_stats["pld"]["accepted"] += 3
    assert before["pld"] == {"offered": 10, "accepted": 4}  # a copy, not the live counts
    assert difference(before, snapshot(proposer)) == {"pld": {"offered": 5, "accepted": 3}}  # cand offered nothing
    assert snapshot(SimpleNamespace()) is None and difference(None, None) is None


def test_table_sums_rows_per_method_with_shares_of_accepted_tokens():
    rows = [
        {"method": "logitspec", "source_counts": {"pld": {"offered": 10, "accepted": 6}}},
        {"method": "logitspec", "source_counts": {"pld": {"offered": 5, "accepted": 0}, "cand": {"offered": 4, "accepted": 2}}},
        {"method": "pld", "source_counts": None},
    ]
    table = source_table(rows)
    assert list(table) == ["logitspec"]
    assert table["logitspec"]["pld"] == {"offered": 15, "accepted": 6, "acceptance": 0.4, "share": 0.75}
    assert table["logitspec"]["cand"]["share"] == pytest.approx(0.25)
    assert "| `logitspec` | pld | 15 | 6 | 40.0% | 75.0% |" in markdown(rows)
    assert markdown(rows[2:]) == ""

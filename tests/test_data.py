"""The bundled Spec-Bench questions, the committed test subset, and how categories are read.

No model is loaded here: these tests read files only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from specdec.data import (
    MT_BENCH_SUBCATEGORIES,
    DataError,
    default_questions_path,
    load_questions,
)

SUBSET = Path(__file__).parent / "data" / "spec_bench_subset.jsonl"
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
SPEC_BENCH_CATEGORIES = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_spec_bench_ships_inside_the_package_with_its_license():
    path = default_questions_path()
    assert path.is_file()
    assert path.parent.name == "spec_bench" and path.parent.parent.name == "datasets"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SPEC_BENCH_SHA256  # unchanged from upstream
    license_text = (path.parent / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0" in license_text
    readme = (path.parent / "README.md").read_text(encoding="utf-8")
    assert "hemingkx/Spec-Bench" in readme and "Apache" in readme
    for source in ("MT-bench", "WMT14", "CNN/DailyMail", "Natural Questions", "GSM8K", "DPR"):
        assert source in readme, source


def test_package_data_is_declared_for_wheels():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    for name in ("question.jsonl", "LICENSE", "README.md"):
        assert f"datasets/spec_bench/{name}" in pyproject, name


def test_packaged_spec_bench_folds_mt_bench():
    questions = load_questions()
    assert len(questions) == 480
    by_category: dict[str, list] = {}
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    assert set(by_category) == SPEC_BENCH_CATEGORIES
    assert {len(v) for v in by_category.values()} == {80}
    mt = by_category["mt_bench"]
    assert {q.subcategory for q in mt} == MT_BENCH_SUBCATEGORIES
    assert all(81 <= int(q.question_id) <= 160 and len(q.turns) == 2 for q in mt)
    coding = load_questions(categories=["coding"], per_category=1)
    assert [(q.question_id, q.category, q.subcategory) for q in coding] == [("121", "mt_bench", "coding")]


def test_subset_is_two_questions_of_each_category_copied_verbatim():
    packaged = set(default_questions_path().read_text(encoding="utf-8").splitlines())
    lines = SUBSET.read_text(encoding="utf-8").splitlines()
    assert all(line in packaged for line in lines)  # byte-identical rows
    questions = load_questions(SUBSET)
    assert len(questions) == 12
    for category in SPEC_BENCH_CATEGORIES:
        assert sum(q.category == category for q in questions) == 2, category
    mt = [q for q in questions if q.category == "mt_bench"]
    assert {q.subcategory for q in mt} == {"math", "coding"} and all(len(q.turns) == 2 for q in mt)
    assert [q.question_id for q in load_questions(SUBSET, per_category=1)] == ["111", "161", "241", "321", "401", "481"]


def test_a_users_math_category_stays_math(tmp_path):
    rows = [
        {"question_id": 111, "category": "math", "turns": ["What is 2 + 2?"]},  # even with an MT-bench id
        {"question_id": 2, "category": "coding", "turns": ["Write hello world in C."]},
        {"question_id": 3, "category": "qa", "prompt": "Who wrote Hamlet?"},
    ]
    questions = load_questions(write_rows(tmp_path / "mine.jsonl", rows))
    assert [(q.category, q.subcategory) for q in questions] == [("math", "math"), ("coding", "coding"), ("qa", "qa")]
    assert [q.question_id for q in load_questions(tmp_path / "mine.jsonl", categories=["math"])] == ["111"]
    with pytest.raises(DataError, match="mt_bench"):
        load_questions(tmp_path / "mine.jsonl", categories=["mt_bench"])


def test_only_mt_bench_ids_fold_in_a_spec_bench_shaped_file(tmp_path):
    rows = [json.loads(line) for line in SUBSET.read_text(encoding="utf-8").splitlines()]
    rows.append({"question_id": 9001, "category": "math", "turns": ["My own math question."]})
    questions = {q.question_id: q for q in load_questions(write_rows(tmp_path / "plus.jsonl", rows))}
    assert (questions["111"].category, questions["111"].subcategory) == ("mt_bench", "math")
    assert (questions["9001"].category, questions["9001"].subcategory) == ("math", "math")
    # Without all of Spec-Bench's other categories the file is the user's: nothing folds.
    partial = [r for r in rows if r["category"] != "rag"]
    assert {q.category for q in load_questions(write_rows(tmp_path / "part.jsonl", partial))} >= {"math", "coding"}


def test_any_path_can_be_given_and_missing_ones_are_refused(tmp_path):
    path = write_rows(tmp_path / "one.jsonl", [{"prompt": "Hello there."}])
    assert [(q.question_id, q.category, q.turns) for q in load_questions(str(path))] == [
        ("1", "default", ("Hello there.",))
    ]
    with pytest.raises(DataError, match="not found"):
        load_questions(tmp_path / "absent.jsonl")

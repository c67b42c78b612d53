"""Spec-Bench questions (and any JSONL of prompts), validated before a model is loaded.

Format: one JSON object per line with `turns` (a list of user turns) or `prompt`
(a string); `question_id` and `category` are optional. The Spec-Bench question
file ships inside the package (`specdec/datasets/spec_bench/question.jsonl`,
with its license and provenance in the README next to it), so a clone or an
installed wheel needs nothing beside it; any other file can be passed by path.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Package data: installed as a plain file next to this module (editable install and wheel alike).
PACKAGED_SPEC_BENCH = Path(__file__).resolve().parent / "datasets" / "spec_bench" / "question.jsonl"

# Spec-Bench reports MT-bench (question ids 81-160) as one category over these eight.
MT_BENCH_SUBCATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
MT_BENCH_IDS = range(81, 161)
# Spec-Bench's categories besides MT-bench: a file holding all five is Spec-Bench or cut from it.
SPEC_BENCH_OTHER_CATEGORIES = frozenset({"translation", "summarization", "qa", "math_reasoning", "rag"})


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str  # Spec-Bench's category: mt_bench, translation, summarization, qa, math_reasoning, rag
    turns: tuple[str, ...]
    subcategory: str = ""  # the file's own category (e.g. MT-bench's "coding")


class DataError(ValueError):
    """A prompts file that is missing, empty or malformed."""


def default_questions_path() -> Path:
    """The Spec-Bench question file shipped in the package (480 questions, Apache-2.0; see its README)."""
    return PACKAGED_SPEC_BENCH


def _parse_line(number: int, line: str, path: Path) -> Question:
    """One row as the file states it: `category` and `subcategory` are both the file's own category."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{number}: not valid JSON ({err.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{path}:{number}: each line must be a JSON object")
    turns = row.get("turns", [row["prompt"]] if "prompt" in row else None)
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise DataError(f"{path}:{number}: needs a non-empty 'turns' list of strings or a 'prompt' string")
    raw = str(row.get("category", "default"))
    return Question(str(row.get("question_id", number)), raw, tuple(turns), raw)


def _is_mt_bench_id(question_id: str) -> bool:
    return question_id.isdigit() and int(question_id) in MT_BENCH_IDS


def fold_mt_bench(questions: Sequence[Question]) -> list[Question]:
    """Spec-Bench's own grouping: its MT-bench rows become category `mt_bench`; any other file is left as is.

    Rule: a file is *Spec-Bench-shaped* when its categories include all five of
    Spec-Bench's other categories (translation, summarization, qa,
    math_reasoning, rag): the packaged file, a copy of it, or a cut of it that
    keeps every category (such as tests/data/spec_bench_subset.jsonl). In such a
    file, and only there, a row whose category is an MT-bench subcategory
    ("math", "coding", ...) *and* whose question id is one of MT-bench's 81-160
    is reported as `mt_bench`, its subcategory kept. Why: a user's own file
    with a category "math" means its own "math", not MT-bench's, and must keep
    it; checking the id as well keeps a user's rows added to a Spec-Bench copy
    in their own category.
    """
    if not SPEC_BENCH_OTHER_CATEGORIES <= {q.category for q in questions}:
        return list(questions)
    return [
        dataclasses.replace(q, category="mt_bench")
        if q.category in MT_BENCH_SUBCATEGORIES and _is_mt_bench_id(q.question_id)
        else q
        for q in questions
    ]


def _select(
    questions: list[Question], categories: Sequence[str] | None, per_category: int | None
) -> list[Question]:
    """Keep the wanted categories (a category or a subcategory), then the first N of each."""
    if categories:
        known = {q.category for q in questions} | {q.subcategory for q in questions}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise DataError(f"unknown categories {unknown}; the file has {sorted(known)}")
        wanted = set(categories)
        questions = [q for q in questions if q.category in wanted or q.subcategory in wanted]
    if per_category is not None:
        seen: dict[str, int] = {}
        kept = []
        for q in questions:
            group = q.subcategory if categories and q.subcategory in categories else q.category
            seen[group] = seen.get(group, 0) + 1
            if seen[group] <= per_category:
                kept.append(q)
        questions = kept
    return questions


def load_questions(
    path: str | Path | None = None,
    categories: Sequence[str] | None = None,
    per_category: int | None = None,
    limit: int | None = None,
) -> list[Question]:
    """Questions from `path` (default: the packaged Spec-Bench), filtered by category, first N per category, then limit."""
    resolved = Path(path) if path is not None else default_questions_path()
    if not resolved.is_file():
        raise DataError(f"prompts file not found: {resolved}")
    lines = [(n, ln) for n, ln in enumerate(resolved.read_text(encoding="utf-8").splitlines(), 1) if ln.strip()]
    questions = fold_mt_bench([_parse_line(n, ln, resolved) for n, ln in lines])
    if not questions:
        raise DataError(f"{resolved}: no prompts in the file")
    questions = _select(questions, categories, per_category)
    return questions[:limit] if limit is not None else questions

"""Spec-Bench questions (and any JSONL of prompts), validated before a model is loaded.

Format: one JSON object per line with `turns` (a list of user turns) or `prompt`
(a string); `question_id` and `category` are optional. The project's copy of
Spec-Bench lives in `shared/data/spec_bench/question.jsonl` beside the checkout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SPEC_BENCH_RELATIVE = Path("shared/data/spec_bench/question.jsonl")


# Spec-Bench reports MT-bench (question ids 81-160) as one category over these eight.
MT_BENCH_SUBCATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str  # Spec-Bench's category: mt_bench, translation, summarization, qa, math_reasoning, rag
    turns: tuple[str, ...]
    subcategory: str = ""  # the file's own category (e.g. MT-bench's "coding")


class DataError(ValueError):
    """A prompts file that is missing, empty or malformed."""


def default_questions_path() -> Path | None:
    """Spec-Bench's question file beside the checkout or the working folder, if there is one."""
    here = Path(__file__).resolve()
    for base in (Path.cwd(), Path.cwd().parent, *here.parents):
        candidate = base / SPEC_BENCH_RELATIVE
        if candidate.is_file():
            return candidate
    return None


def _parse_line(number: int, line: str, path: Path) -> Question:
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
    category = "mt_bench" if raw in MT_BENCH_SUBCATEGORIES else raw
    return Question(str(row.get("question_id", number)), category, tuple(turns), raw)


def load_questions(
    path: str | Path | None = None,
    categories: Sequence[str] | None = None,
    per_category: int | None = None,
    limit: int | None = None,
) -> list[Question]:
    """Questions from `path` (default: Spec-Bench), filtered by category, first N per category, then limit."""
    resolved = Path(path) if path is not None else default_questions_path()
    if resolved is None or not resolved.is_file():
        raise DataError(f"prompts file not found: {resolved or SPEC_BENCH_RELATIVE}")
    lines = [(n, ln) for n, ln in enumerate(resolved.read_text(encoding="utf-8").splitlines(), 1) if ln.strip()]
    questions = [_parse_line(n, ln, resolved) for n, ln in lines]
    if not questions:
        raise DataError(f"{resolved}: no prompts in the file")
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
    return questions[:limit] if limit is not None else questions

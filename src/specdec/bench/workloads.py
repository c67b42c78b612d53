"""Workloads beyond Spec-Bench's independent questions: requests that share context across requests.

Why: Spec-Bench's questions are unrelated, so a store of earlier requests
(`logitspec:session=true`, the `session` method; SuffixDecoding's setting) has
nothing to find there. Real traffic often asks several things about one
document, one after another. The `session` workload does that: for each of the
first N Spec-Bench summarization articles, three separate single-turn requests
(the original "Summarize:" question, then a bullet-point summary, then the
main facts), in that order, so the second and third may reuse what the first
answers said. Nothing is repeated verbatim: a cache of identical requests is
not what is measured.

The workload is written as a Spec-Bench-style JSONL file (category `session`)
at a fixed path per N, so `specdec bench --resume` sees the same data.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.data import load_questions

SUMMARIZE = "Summarize: "
FOLLOW_UPS = (
    "{doc}\n\nSummarize the document above in three bullet points.",
    "{doc}\n\nWhat are the main facts reported in the document above? Answer in a few sentences.",
)
WORKLOADS = ("spec-bench", "session")


def session_questions(num_documents: int) -> list[dict]:
    """Rows (question_id, category, turns) of the session workload over the first `num_documents` articles."""
    rows = []
    for question in load_questions(categories=["summarization"], per_category=num_documents):
        first = question.turns[0]
        doc = first.removeprefix(SUMMARIZE)
        turns = [first, *(template.format(doc=doc) for template in FOLLOW_UPS)]
        for i, turn in enumerate(turns, 1):
            rows.append({"question_id": f"{question.question_id}-{i}", "category": "session", "turns": [turn]})
    return rows


def write_session_workload(folder: Path, num_documents: int) -> Path:
    """The session workload's JSONL file in `folder` (rewritten only when missing or different)."""
    path = Path(folder) / f"session-{num_documents}.jsonl"
    text = "".join(json.dumps(row) + "\n" for row in session_questions(num_documents))
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path

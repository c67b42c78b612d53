"""Spec-Bench prompts of every category and plain decoding's outputs on them, for "token-identical to plain" tests.

Why a module: every lossless test compares against the same thing, plain decoding on
the committed Spec-Bench subset, one prompt per category (chat template applied).
`PlainRuns` computes each plain output once; conftest.py holds one for the session
(`plain_runs`), so the matrix in tests/test_lossless.py and the tests beside it share them.
"""

from __future__ import annotations

from pathlib import Path

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams

CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def prompts_by_category(
    tokenizer, subset: Path, categories: tuple[str, ...] = CATEGORIES
) -> dict[str, list[int]]:
    """`category-question_id` -> prompt token ids, the first question of each category in `categories`."""
    questions = [q for q in load_questions(subset, per_category=1) if q.category in categories]
    assert sorted({q.category for q in questions}) == sorted(categories)
    return {
        f"{q.category}-{q.question_id}": encode_prompt(tokenizer, q.turns[0], chat=True) for q in questions
    }


class PlainRuns:
    """Plain decoding's tokens per (prompt, length, sampling), each computed once: what lossless tests compare with."""

    def __init__(self, engine: Engine, prompts: dict[str, list[int]]) -> None:
        self.engine, self.prompts = engine, prompts
        self.outputs: dict[tuple[str, int, SamplingParams], list[int]] = {}

    def tokens(self, name: str, max_new_tokens: int, sampling: SamplingParams | None = None) -> list[int]:
        key = (name, max_new_tokens, sampling or SamplingParams())
        if key not in self.outputs:
            config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=key[2])
            self.outputs[key] = self.engine.generate(self.prompts[name], PlainProposer(), config).token_ids
        return self.outputs[key]

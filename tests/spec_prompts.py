"""Spec-Bench prompts of every category and their plain greedy outputs, for "token-identical to plain" tests.

Why a module: every drafting method's identity test compares against the same
thing, plain greedy decoding on the committed Spec-Bench subset, one prompt per
category (chat template applied). Plain functions, not fixtures, so each test
module keeps its own module-scoped fixtures and token counts; plain outputs are
computed once per (engine, prompt, length) and shared by the modules.
"""

from __future__ import annotations

from pathlib import Path

from specdec.data import load_questions
from specdec.engine import Engine
from specdec.generation import GenerationConfig
from specdec.prompts import encode_prompt
from specdec.proposers.plain import PlainProposer

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


# (engine id, prompt, max_new_tokens) -> plain greedy tokens: test modules on the session's engine share them.
_PLAIN: dict[tuple[int, tuple[int, ...], int], list[int]] = {}


def plain_outputs(engine: Engine, prompts: dict[str, list[int]], max_new_tokens: int) -> dict[str, list[int]]:
    """Plain greedy output tokens per prompt (computed once per engine, prompt and length)."""
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    out = {}
    for name, ids in prompts.items():
        key = (id(engine), tuple(ids), max_new_tokens)
        if key not in _PLAIN:
            _PLAIN[key] = engine.generate(ids, PlainProposer(), config).token_ids
        out[name] = _PLAIN[key]
    return out

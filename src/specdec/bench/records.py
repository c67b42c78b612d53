"""One timed generation (`RunResult`) and its row in responses.jsonl.

Why: our engine and transformers' `generate` report different things (ours
knows every step's draft and verify time, transformers knows none of it), yet
the report must put them side by side. Both are turned into one `RunResult`;
what a method cannot measure is None, never a made-up number.

Invariants:
- `token_ids` are the new tokens only, cut after the first EOS (kept, as our
  engine and transformers both keep it) and never longer than max_new_tokens;
- `wall_time_s` is taken by the benchmark's own stopwatch around the whole
  call, the same way for every method (prompt ids are built before it starts);
- MAT as the engine defines it: (new tokens - 1) / decode steps, the prefill's
  forward pass and the token it yields left out (plain decoding = 1.00 exactly);
  decode steps = target forward passes - 1 (the prefill), for transformers too;
- exact-match flags are computed here from token ids, never assumed, and
  recomputed over all rows once a run ends (`fill_match_flags`);
- a row is identified by (question_id, turn, method) (`pair_key`): a resumed
  run skips the pairs already in responses.jsonl.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.data import Question
from specdec.engine.generation import GenerationOutput


@dataclass(frozen=True)
class RunResult:
    token_ids: list[int]
    text: str
    num_prompt_tokens: int
    wall_time_s: float
    finish_reason: str
    num_forward_passes: int | None = None  # target forward passes, prefill included
    prefill_s: float | None = None
    draft_time_s: float | None = None
    verify_time_s: float | None = None
    retrieval_success: float | None = None
    acceptance_rate: float | None = None
    accepted_histogram: dict[int, int] | None = None
    source_counts: dict[str, dict[str, int]] | None = None  # per draft source: offered / accepted nodes

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_decode_steps(self) -> int | None:
        return self.num_forward_passes - 1 if self.num_forward_passes else None

    @property
    def mat(self) -> float | None:
        """Tokens per decoding forward pass, the prefill and its token excluded (1.0 when there was no step)."""
        steps = self.num_decode_steps
        if steps is None:
            return None
        return (self.num_new_tokens - 1) / steps if steps else 1.0

    @property
    def other_time_s(self) -> float | None:
        """Wall time not spent in prefill, drafting or verification (sampling, bookkeeping, detokenizing)."""
        parts = (self.prefill_s, self.draft_time_s, self.verify_time_s)
        if any(p is None for p in parts):
            return None
        return max(self.wall_time_s - sum(parts), 0.0)


def from_engine(out: GenerationOutput, num_prompt_tokens: int, wall_time_s: float) -> RunResult:
    stats = out.stats
    return RunResult(
        token_ids=[int(t) for t in out.token_ids],
        text=out.text,
        num_prompt_tokens=num_prompt_tokens,
        wall_time_s=wall_time_s,
        finish_reason=out.finish_reason,
        num_forward_passes=stats.num_decode_steps + 1,
        prefill_s=stats.prefill_s,
        draft_time_s=stats.draft_time_s,
        verify_time_s=stats.verify_time_s,
        retrieval_success=stats.retrieval_success,
        acceptance_rate=stats.acceptance_rate,
        accepted_histogram=stats.accepted_histogram,
    )


def cut_at_eos(token_ids: Iterable[int], eos_token_ids: Iterable[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """New tokens up to and including the first EOS, at most max_new_tokens; and whether EOS ended them."""
    eos = frozenset(eos_token_ids)
    kept: list[int] = []
    for token in token_ids:
        if len(kept) == max_new_tokens:
            break
        kept.append(int(token))
        if token in eos:
            return kept, True
    return kept, False


PairKey = tuple[str, int, str]  # (question_id, turn, method): one row of responses.jsonl


def pair_key(row: Mapping[str, Any]) -> PairKey:
    return str(row["question_id"]), int(row["turn"]), str(row["method"])


def match_field(baseline: str) -> str:
    return "match_" + baseline.replace("-", "_")


def match_fields(
    token_ids: Sequence[int], baseline_rows: Mapping[str, Mapping[str, Any] | None], baselines: Sequence[str]
) -> dict[str, bool | None]:
    """{match_<baseline>: token-identical to that baseline's row for the same turn (None: no such row yet)}."""
    flags: dict[str, bool | None] = {}
    for baseline in baselines:
        other = baseline_rows.get(baseline)
        flags[match_field(baseline)] = None if other is None else list(token_ids) == list(other["token_ids"])
    return flags


def fill_match_flags(rows: Sequence[dict[str, Any]], baselines: Sequence[str]) -> list[dict[str, Any]]:
    """The rows with every match flag recomputed from token ids over all rows (new dicts; order kept).

    Rows are written the moment their run completes, before every baseline of
    that turn may have run (methods take turns in rotating order, and a resumed
    run adds rows later), so a row's flags are final only once all rows are in.
    """
    by_key = {pair_key(row): row for row in rows}
    filled = []
    for row in rows:
        qid, turn, _ = pair_key(row)
        bases = {b: by_key.get((qid, turn, b)) for b in baselines}
        filled.append({**row, **match_fields(row["token_ids"], bases, baselines)})
    return filled


def make_row(
    label: str, question: Question, turn: int, result: RunResult, matches: Mapping[str, bool | None]
) -> dict[str, Any]:
    """The responses.jsonl row of one method on one question turn (turn counts from 1).

    `matches`: {match_<baseline>: flag} as `match_fields` returns it.
    """
    row: dict[str, Any] = {
        "method": label,
        "question_id": question.question_id,
        "category": question.category,
        "subcategory": question.subcategory,
        "turn": turn,
        "num_prompt_tokens": result.num_prompt_tokens,
        "new_tokens": result.num_new_tokens,
        "wall_time_s": result.wall_time_s,
        "tokens_per_s": result.num_new_tokens / result.wall_time_s if result.wall_time_s > 0 else 0.0,
        "forward_passes": result.num_forward_passes,
        "decode_steps": result.num_decode_steps,
        "mat": result.mat,
        "accepted_histogram": (
            {str(k): v for k, v in result.accepted_histogram.items()} if result.accepted_histogram is not None else None
        ),
        "prefill_s": result.prefill_s,
        "draft_time_s": result.draft_time_s,
        "verify_time_s": result.verify_time_s,
        "other_time_s": result.other_time_s,
        "retrieval_success": result.retrieval_success,
        "acceptance_rate": result.acceptance_rate,
        "finish_reason": result.finish_reason,
        "source_counts": result.source_counts,
    }
    row.update(matches)
    row["token_ids"] = result.token_ids
    row["text"] = result.text
    return row

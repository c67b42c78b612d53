"""From responses.jsonl rows to the numbers in the report: tokens/s, speedup, MAT, exact match.

Why one function: the summary table, the CSV, the plots and the JSON printed on
the last line must never disagree, so they are all read from the one
`BenchSummary` computed here, and it is computed from the rows alone (the same
rows written to responses.jsonl), so anyone can recompute it from the file.

Definitions (Spec-Bench's evaluation/speed.py, one question = all its turns):
- tokens/s of a method = mean over questions of (new tokens summed over the
  question's turns / wall time summed over them);
- speedup vs a baseline = that mean / the baseline's mean, over the same
  questions (the same category), measured in the same run;
- MAT = (new tokens - 1) / decode steps, both summed over the rows: the
  engine's definition (the prefill's pass and token left out, plain = 1.00);
  None when a method's forward passes are unknown;
- exact match vs a baseline = share of (question, turn) rows whose token ids
  equal the baseline's token ids for that question and turn.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from specdec.bench.config import BASELINES

OVERALL = "overall"


def match_key(baseline: str) -> str:
    return "match_" + baseline.replace("-", "_")


@dataclass(frozen=True)
class BenchSummary:
    out_dir: str
    methods: tuple[str, ...]
    categories: tuple[str, ...]  # in the order of the prompts file; OVERALL is not among them
    baselines: dict[str, bool]  # baseline -> it was run
    stats: dict[str, dict[str, dict[str, Any]]]  # method -> category or OVERALL -> metrics
    histograms: dict[str, dict[int, int] | None]  # method -> accepted length -> steps (None: unknown)
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "baselines": self.baselines,
            "notes": list(self.notes),
            "methods": {
                label: {
                    OVERALL: self.stats[label][OVERALL],
                    "categories": {c: self.stats[label][c] for c in self.categories},
                }
                for label in self.methods
            },
        }


def _per_question_speed(rows: Sequence[dict[str, Any]]) -> list[float]:
    tokens: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    for row in rows:
        tokens[row["question_id"]] += row["new_tokens"]
        seconds[row["question_id"]] += row["wall_time_s"]
    return [tokens[q] / seconds[q] if seconds[q] > 0 else 0.0 for q in tokens]


def _mean_or_none(values: Sequence[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return mean(known) if known and len(known) == len(values) else None


def _mat(num_decoded_tokens: int, steps: Sequence[int | None]) -> float | None:
    if not steps or None in steps:
        return None
    total = sum(s for s in steps if s is not None)
    return num_decoded_tokens / total if total else 1.0


def group_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of one method over one group of rows (a category, or all)."""
    steps = [row["decode_steps"] for row in rows]
    new_tokens = sum(row["new_tokens"] for row in rows)
    metrics: dict[str, Any] = {
        "num_questions": len({row["question_id"] for row in rows}),
        "num_turns": len(rows),
        "new_tokens": new_tokens,
        "wall_time_s": sum(row["wall_time_s"] for row in rows),
        "tokens_per_s": mean(_per_question_speed(rows)) if rows else 0.0,
        "mat": _mat(new_tokens - len(rows), steps),
        "retrieval_success": _mean_or_none([row["retrieval_success"] for row in rows]),
        "acceptance_rate": _mean_or_none([row["acceptance_rate"] for row in rows]),
    }
    for baseline in BASELINES:
        metrics["exact_match_" + baseline.replace("-", "_")] = _mean_or_none(
            [row.get(match_key(baseline)) for row in rows]
        )
    return metrics


def _add_speedups(stats: dict[str, dict[str, dict[str, Any]]], baselines: dict[str, bool]) -> None:
    for per_group in stats.values():
        for group, metrics in per_group.items():
            for baseline in BASELINES:
                key = "speedup_vs_" + baseline.replace("-", "_")
                base = stats[baseline][group]["tokens_per_s"] if baselines[baseline] else 0.0
                metrics[key] = metrics["tokens_per_s"] / base if base > 0 else None


def _histogram(rows: Sequence[dict[str, Any]]) -> dict[int, int] | None:
    if any(row["accepted_histogram"] is None for row in rows):
        return None
    total: Counter[int] = Counter()
    for row in rows:
        total.update({int(k): v for k, v in row["accepted_histogram"].items()})
    return dict(sorted(total.items()))


def summarize(
    rows: Sequence[dict[str, Any]], labels: Sequence[str], out_dir: str | Path, notes: Sequence[str] = ()
) -> BenchSummary:
    categories = tuple(dict.fromkeys(row["category"] for row in rows))
    by_method: dict[str, list[dict[str, Any]]] = {label: [r for r in rows if r["method"] == label] for label in labels}
    baselines = {b: b in by_method for b in BASELINES}
    stats = {
        label: {
            **{c: group_metrics([r for r in method_rows if r["category"] == c]) for c in categories},
            OVERALL: group_metrics(method_rows),
        }
        for label, method_rows in by_method.items()
    }
    _add_speedups(stats, baselines)
    notes = tuple(notes) + tuple(
        f"{b} was not among the methods: no speedup or exact match vs {b}" for b, ran in baselines.items() if not ran
    )
    histograms = {label: _histogram(method_rows) for label, method_rows in by_method.items()}
    return BenchSummary(str(out_dir), tuple(labels), categories, baselines, stats, histograms, notes)

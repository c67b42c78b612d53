"""A `specdec bench` sitting's speedups three ways, from its rows alone: as published (each question's tokens over
its runs' wall time, prefill included), with every run charged its prompt's fresh prefill (the largest prefill any
method paid for that question and turn), and decode only (the prefill left out).

Why: from 2026-11-28 22:11 UTC until this fix the bench's engine kept whole-prompt prefills (`prompt_cache`) while
the methods took turns on each prompt, so the first to run paid the prefill and the rest took it from the cache; a
method whose head captures layers (EAGLE, Medusa, Hydra) keys another entry and paid it more often.

Usage: python recompute.py FOLDER...   (each holding responses.jsonl.gz)"""

import gzip
import json
import statistics
import sys
from collections import defaultdict

Key = tuple[int, int]  # (question, turn)


def speed(rows: list[dict], prefill: dict[Key, float] | None) -> float:
    """Spec-Bench's tokens/s: the mean over questions of tokens over seconds. prefill: each run's prefill replaced
    by the given one (0.0 everywhere: decode only); None: as run."""
    tokens: dict[int, int] = defaultdict(int)
    seconds: dict[int, float] = defaultdict(float)
    for row in rows:
        wall = row["wall_time_s"]
        if prefill is not None and row.get("prefill_s") is not None:
            wall += prefill[(row["question_id"], row["turn"])] - row["prefill_s"]
        tokens[row["question_id"]] += row["new_tokens"]
        seconds[row["question_id"]] += wall
    return statistics.mean(tokens[q] / seconds[q] for q in tokens)


def main(folders: list[str]) -> None:
    for folder in folders:
        with gzip.open(f"{folder}/responses.jsonl.gz", "rt") as file:
            rows = [json.loads(line) for line in file]
        fresh: dict[Key, float] = defaultdict(float)
        for row in rows:
            if row.get("prefill_s") is not None:
                key = (row["question_id"], row["turn"])
                fresh[key] = max(fresh[key], row["prefill_s"])
        taken = sum(1 for r in rows if r.get("prefill_s") is not None and r["prefill_s"] < 0.2 * fresh[(r["question_id"], r["turn"])])
        methods = list(dict.fromkeys(row["method"] for row in rows))
        base = "plain" if "plain" in methods else methods[0]
        by_method = {m: [row for row in rows if row["method"] == m] for m in methods}
        ways = {"as published": None, "every prefill paid": fresh, "decode only": defaultdict(float)}
        speeds = {way: {m: speed(by_method[m], prefill) for m in methods} for way, prefill in ways.items()}
        print(f"{folder}: {len(rows)} runs, {taken} of them took their prompt's prefill from the cache; x `{base}`:")
        for m in methods:
            cells = "  ".join(f"{way} {speeds[way][m] / speeds[way][base]:.3f}" for way in ways)
            print(f"  {m:54s} {cells}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Speed of specdec's NGramIndex: indexing a 32k-token sequence and looking n-grams up.

Data: the Spec-Bench questions (packaged: src/specdec/datasets/spec_bench/question.jsonl), their
turns concatenated and split into words and punctuation, each distinct piece
mapped to an integer id in order of first appearance (no tokenizer needed). If
the file is missing, a synthetic sequence is used instead: random ids over a
49152 vocabulary with copied segments mixed in, so that n-grams repeat.

Measured, for max_ngram=3 and both occurrence policies:
- indexing the whole sequence in one `extend` (how a prompt is indexed) and in
  chunks of 1-8 tokens (how accepted tokens arrive while decoding): total time
  and mean cost per token;
- `lookup_with_ngram` mean time per call on the full index, for three kinds of
  query: a tail of the sequence (found at m = max_ngram: one dict look-up), a
  tail plus a candidate token that is not indexed (LogitSpec's query: usually
  falls back to shorter m), and unseen tokens (every m tried, no match);
- a prompt-lookup decode simulation: the first half indexed as the prompt, then
  the rest arrives in chunks of 1-8 tokens with one lookup of the current tail
  after each chunk; hit rate and mean matched m there (the timing rows above
  have hit rates that say nothing about usefulness);
- for scale, a linear scan (numpy sliding windows, what a stateless prompt
  lookup does each step) on a few of the same queries.

The table goes to stdout; the last stdout line is one JSON document with the numbers.

    .venv/bin/python benchmarks/ngram_index_speed.py [--num-tokens 32768] [--max-ngram 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:
    from specdec.data import default_questions_path
    from specdec.proposers.ngram_index import NGramIndex
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO / "src"))
    from specdec.data import default_questions_path
    from specdec.proposers.ngram_index import NGramIndex

DEFAULT_DATA = default_questions_path()
SYNTHETIC_VOCAB = 49152


def spec_bench_tokens(path: Path, num_tokens: int) -> tuple[list[int], int]:
    """Word/punctuation ids of the concatenated question turns, and the vocabulary size."""
    vocab: dict[str, int] = {}
    ids: list[int] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            for turn in json.loads(line)["turns"]:
                for piece in re.findall(r"\w+|[^\w\s]", turn):
                    ids.append(vocab.setdefault(piece, len(vocab)))
            if len(ids) >= num_tokens:
                break
    if len(ids) < num_tokens:  # too little text: repeat it (repeats only add matches)
        ids = ids * (num_tokens // max(len(ids), 1) + 1)
    return ids[:num_tokens], len(vocab)


def synthetic_tokens(num_tokens: int, rng: random.Random) -> list[int]:
    ids: list[int] = []
    while len(ids) < num_tokens:
        if ids and rng.random() < 0.3:
            start = rng.randrange(len(ids))
            ids.extend(ids[start : start + rng.randint(5, 60)])
        else:
            ids.extend(rng.randrange(SYNTHETIC_VOCAB) for _ in range(rng.randint(5, 40)))
    return ids[:num_tokens]


def best_of(repeats: int, fn) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def time_lookups(index: NGramIndex, queries: list[list[int]], max_continuation: int, repeats: int):
    lookup = index.lookup_with_ngram

    def run():
        for query in queries:
            lookup(query, max_continuation)

    seconds = best_of(repeats, run)
    matched = [lookup(query, max_continuation)[1] for query in queries]
    hits = [m for m in matched if m]
    return {
        "mean_lookup_us": seconds / len(queries) * 1e6,
        "hit_rate": len(hits) / len(queries),
        "mean_matched_ngram": sum(hits) / len(hits) if hits else 0.0,
    }


def decode_simulation(
    tokens: list[int], max_ngram: int, prefer: str, max_continuation: int, rng: random.Random
):
    """Prompt lookup while decoding: index a prompt, then per step add 1-8 tokens and query the tail."""
    index = NGramIndex(max_ngram, prefer)
    prompt_len = len(tokens) // 2
    index.extend(tokens[:prompt_len])
    num_steps = num_hits = sum_m = num_correct = 0
    pos = prompt_len
    while pos < len(tokens):
        size = rng.randint(1, 8)
        index.extend(tokens[pos : pos + size])
        pos += size
        draft, m = index.lookup_with_ngram(tokens[pos - max_ngram : pos], max_continuation)
        num_steps += 1
        if m:
            num_hits += 1
            sum_m += m
            # How many drafted tokens the true text would have accepted (greedy, chain).
            for guess, truth in zip(draft, tokens[pos:], strict=False):
                if guess != truth:
                    break
                num_correct += 1
    return {
        "num_steps": num_steps,
        "hit_rate": num_hits / num_steps,
        "mean_matched_ngram": sum_m / num_hits if num_hits else 0.0,
        "mean_correct_draft_tokens_per_step": num_correct / num_steps,
    }


def scan_lookup(tokens: np.ndarray, windows: list[np.ndarray], suffix: list[int], max_continuation: int):
    """Stateless reference: compare the query tail with every window of the sequence (latest wins)."""
    for m in range(len(windows), 0, -1):
        if len(suffix) < m:
            continue
        hits = np.flatnonzero((windows[m - 1] == np.asarray(suffix[-m:])).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + m
            return tokens[start : start + max_continuation].tolist(), m
    return [], 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, default=32768)
    parser.add_argument("--max-ngram", type=int, default=3)
    parser.add_argument("--max-continuation", type=int, default=10)
    parser.add_argument("--num-queries", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs per timing")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    if args.data.is_file():
        tokens, vocab_size = spec_bench_tokens(args.data, args.num_tokens)
        source = f"spec_bench questions ({args.data.name}), word/punctuation ids"
    else:
        tokens, vocab_size = synthetic_tokens(args.num_tokens, rng), SYNTHETIC_VOCAB
        source = "synthetic: random ids + copied segments"
    num_tokens = len(tokens)

    # Decode-style chunks of 1..8 tokens, the same split for every run.
    chunks, pos = [], 0
    while pos < num_tokens:
        size = rng.randint(1, 8)
        chunks.append(tokens[pos : pos + size])
        pos += size
    ctx = max(args.max_ngram, 8)
    positions = [rng.randrange(ctx, num_tokens) for _ in range(args.num_queries)]
    query_sets = {
        "tail": [tokens[p - ctx : p] for p in positions],
        # LogitSpec: context tail + a candidate next token that is not in the index yet.
        "tail_plus_candidate": [tokens[p - ctx : p] + [rng.randrange(vocab_size)] for p in positions],
        "unseen": [[vocab_size + rng.randrange(1000) for _ in range(ctx)] for _ in positions],
    }

    results = []
    for prefer in ("latest", "earliest"):

        def index_at_once(prefer=prefer):
            NGramIndex(args.max_ngram, prefer).extend(tokens)

        def index_in_chunks(prefer=prefer):
            index = NGramIndex(args.max_ngram, prefer)
            for chunk in chunks:
                index.extend(chunk)

        once_s = best_of(args.repeats, index_at_once)
        chunked_s = best_of(args.repeats, index_in_chunks)
        index = NGramIndex(args.max_ngram, prefer)
        index.extend(tokens)
        results.append(
            {
                "prefer": prefer,
                "index_once_ms": once_s * 1e3,
                "index_once_us_per_token": once_s / num_tokens * 1e6,
                "index_chunked_ms": chunked_s * 1e3,
                "index_chunked_us_per_token": chunked_s / num_tokens * 1e6,
                "lookup": {
                    name: time_lookups(index, queries, args.max_continuation, args.repeats)
                    for name, queries in query_sets.items()
                },
                "decode_simulation": decode_simulation(
                    tokens, args.max_ngram, prefer, args.max_continuation, random.Random(args.seed + 1)
                ),
            }
        )

    # Linear-scan baseline on a few queries (it is milliseconds per query), and a spot check
    # that it agrees with the index (prefer="latest").
    array = np.asarray(tokens, dtype=np.int64)
    windows = [np.lib.stride_tricks.sliding_window_view(array[:-1], m) for m in range(1, args.max_ngram + 1)]
    # windows[m-1][j] = tokens[j : j+m], continuation at j+m <= num_tokens-1 (excludes the final n-gram).
    scan_queries = query_sets["tail_plus_candidate"][:200]
    start = time.perf_counter()
    scan_answers = [scan_lookup(array, windows, q, args.max_continuation) for q in scan_queries]
    scan_us = (time.perf_counter() - start) / len(scan_queries) * 1e6
    latest = NGramIndex(args.max_ngram, "latest")
    latest.extend(tokens)
    agree = all(
        latest.lookup_with_ngram(q, args.max_continuation) == a
        for q, a in zip(scan_queries, scan_answers, strict=True)
    )

    print(
        f"NGramIndex speed: {num_tokens} tokens ({source}; vocab {vocab_size}), max_ngram={args.max_ngram}, "
        f"max_continuation={args.max_continuation}, best of {args.repeats}, python {platform.python_version()}"
    )
    print()
    header = f"{'prefer':<9} {'index all at once':>21} {'index 1-8 tokens/call':>25}"
    print(header)
    print("-" * len(header))
    for row in results:
        print(
            f"{row['prefer']:<9} {row['index_once_ms']:>7.1f} ms {row['index_once_us_per_token']:>6.2f} us/tok "
            f"{row['index_chunked_ms']:>11.1f} ms {row['index_chunked_us_per_token']:>6.2f} us/tok"
        )
    print()
    header = f"{'prefer':<9} {'lookup: query':<20} {'us/call':>8} {'hit rate':>9} {'mean m':>7}"
    print(header)
    print("-" * len(header))
    for row in results:
        for name, stats in row["lookup"].items():
            print(
                f"{row['prefer']:<9} {name:<20} {stats['mean_lookup_us']:>8.2f} {stats['hit_rate']:>9.1%} "
                f"{stats['mean_matched_ngram']:>7.2f}"
            )
    print()
    for row in results:
        sim = row["decode_simulation"]
        print(
            f"decode simulation, prefer={row['prefer']}: {sim['num_steps']} steps, hit rate {sim['hit_rate']:.1%}, "
            f"mean m {sim['mean_matched_ngram']:.2f}, correct draft tokens/step "
            f"{sim['mean_correct_draft_tokens_per_step']:.2f}"
        )
    print(
        f"linear scan baseline (numpy sliding windows, tail_plus_candidate queries): {scan_us:.0f} us per lookup; "
        f"agrees with the index: {agree}"
    )

    summary = {
        "benchmark": "ngram_index_speed",
        "num_tokens": num_tokens,
        "data": source,
        "vocab_size": vocab_size,
        "max_ngram": args.max_ngram,
        "max_continuation": args.max_continuation,
        "num_queries": len(positions),
        "repeats": args.repeats,
        "python": platform.python_version(),
        "results": results,
        "scan_baseline_us_per_lookup": scan_us,
        "scan_agrees_with_index": agree,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Load test of the batching server: aggregate tokens/s and per-request latency at 1..N concurrent clients.

    .venv/bin/python benchmarks/batch_load.py [--methods plain,logitspec] [--clients 1,2,4,8,16]
        [--max-batch 1,16] [--max-tokens 128] [--requests 16] [--prefill-chunk N] [--out FILE.jsonl]

For every (--max-batch, method) it starts `specdec serve` (loopback, free port, --dtype, greedy) and
for every client count c runs c streaming clients that together send `max(--requests, c)` Spec-Bench
first-turn prompts (the first 10 of each category, in a fixed interleaved order) and records:
aggregate completion tokens / wall time; per request, time to first token (TTFT) and time per output
token after the first (TPOT), with p50 and p95. `--max-batch 1` is the one-at-a-time server. Greedy
replies are compared across configurations: in fp32 they must be equal (the script stops otherwise);
in bf16 a batch's other matrix shapes round differently, so a few may differ (counted, `differing`).
Each finished point is appended to --out as it completes (resumable: points already there are
skipped). The last stdout line is one JSON document with every point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from specdec.data import default_questions_path, load_questions
from specdec.serve.process import running_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--methods", default="plain,logitspec")
    p.add_argument("--clients", default="1,2,4,8,16")
    p.add_argument("--max-batch", default="1,16", help="server --max-batch values (1: one at a time)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prefill-chunk", type=int, default=0, help="server --prefill-chunk (0: the server sizes it)")
    p.add_argument("--requests", type=int, default=16, help="requests per point (at least one per client)")
    p.add_argument("--out", default="benchmarks/results/batch_load.jsonl")
    return p.parse_args(argv)


def spec_bench_prompts() -> list[str]:
    """First turns of the first 10 questions of each category, interleaved across categories."""
    by_category: dict[str, list[str]] = {}
    for question in load_questions(default_questions_path(), per_category=10):
        by_category.setdefault(question.category, []).append(question.turns[0])
    columns = list(by_category.values())
    return [column[i] for i in range(10) for column in columns if i < len(column)]


def one_request(http: httpx.Client, url: str, prompt: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    first, text, tokens = None, [], 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
    end = time.perf_counter()
    first = first or end
    return {"prompt": prompt, "text": "".join(text), "tokens": tokens, "ttft_s": first - start,
            "tpot_s": (end - first) / max(tokens - 1, 1), "latency_s": end - start}  # fmt: skip


def run_point(url: str, prompts: list[str], clients: int, max_tokens: int) -> tuple[dict, list[dict]]:
    queue = list(prompts)
    per_client = [queue[i::clients] for i in range(clients)]

    def client(own: list[str]) -> list[dict]:
        with httpx.Client(timeout=1800) as http:
            return [one_request(http, url, prompt, max_tokens) for prompt in own]

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        replies = [reply for replies in pool.map(client, per_client) for reply in replies]
    wall_s = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in replies)

    def pct(key: str, q: float) -> float:
        values = sorted(r[key] for r in replies)
        return values[min(len(values) - 1, int(q * len(values)))]

    point = {"clients": clients, "requests": len(replies), "completion_tokens": tokens, "wall_s": wall_s,
             "tokens_per_s": tokens / wall_s, "ttft_p50_s": statistics.median(r["ttft_s"] for r in replies),
             "ttft_p95_s": pct("ttft_s", 0.95), "tpot_p50_s": statistics.median(r["tpot_s"] for r in replies),
             "tpot_p95_s": pct("tpot_s", 0.95)}  # fmt: skip
    return point, replies


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    seen = {(p["max_batch"], p["method"], p["clients"], p.get("prefill_chunk", 0)) for p in done}
    texts = {(p["method"], prompt): text for p in done for prompt, text in p.get("texts", {}).items()}
    all_prompts = spec_bench_prompts()
    for max_batch in [int(x) for x in args.max_batch.split(",")]:
        for method in args.methods.split(","):
            todo = [int(c) for c in args.clients.split(",") if (max_batch, method, int(c), args.prefill_chunk) not in seen]
            if not todo:
                continue
            serve_args = ["--model", args.model, "--dtype", args.dtype, "--method", method, "--max-batch",
                          str(max_batch), "--max-queue", "256", "--max-tokens-limit", str(args.max_tokens),
                          "--log-level", "warning"]  # fmt: skip
            serve_args += ["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []
            log = Path(tempfile.mkdtemp(prefix="specdec-batch-load-")) / "server.log"
            with running_server(serve_args, log) as server:
                one_request(httpx.Client(timeout=600), server.url, all_prompts[0], 8)  # warm up
                for clients in todo:
                    prompts = all_prompts[: max(args.requests, clients)]
                    point, replies = run_point(server.url, prompts, clients, args.max_tokens)
                    differing = sum(texts.setdefault((method, r["prompt"]), r["text"]) != r["text"] for r in replies)
                    if differing and args.dtype in ("fp32", "float32"):
                        raise SystemExit(f"{method}: {differing} fp32 replies differ between configurations")
                    point.update(differing=differing, max_batch=max_batch, method=method, max_tokens=args.max_tokens, dtype=args.dtype,
                                 prefill_chunk=args.prefill_chunk,
                                 texts={r["prompt"]: r["text"] for r in replies})  # fmt: skip
                    with out.open("a") as f:
                        f.write(json.dumps(point) + "\n")
                    done.append(point)
                    print(f"max_batch {max_batch} {method:10s} clients {clients:2d}: {point['tokens_per_s']:6.1f} "
                          f"tok/s, TTFT p50 {point['ttft_p50_s']:.2f} s, TPOT p50 {1000 * point['tpot_p50_s']:.0f} ms",
                          file=sys.stderr, flush=True)  # fmt: skip
    print(json.dumps([{k: v for k, v in p.items() if k != "texts"} for p in done]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

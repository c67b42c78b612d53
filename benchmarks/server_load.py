"""Load test of `specdec serve` on loopback: tokens/s for 1 and N concurrent clients, and the
per-request overhead of the server over direct library calls.

    .venv/bin/python benchmarks/server_load.py [--method logitspec] [--max-tokens 32] [--clients 8]

It starts its own server (127.0.0.1, free port, fp32 for exact comparisons) and stops it at
the end. Greedy decoding, so server and library produce the same tokens; the script checks
that they do. Measures:
- overhead: for each prompt, median over --runs of (server wall time of one non-streaming
  request, seen by the client) minus (wall time of `Engine.generate` in this process, same
  method and settings, proposer built per call as the server does). The library runs on a
  worker thread like the server's decode loop: on a busy machine, torch's intra-op threads
  were seen to run several times slower when called from the main thread, which would
  otherwise be mistaken for (negative) server overhead. Only one of the two runs at a time;
- throughput: completion tokens / wall time with 1 client, then with --clients concurrent
  streaming clients (each sends --requests-per-client requests); the server decodes one
  request at a time, so concurrency should keep tokens/s, not raise it.
The last line printed is one JSON object with every number.
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

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.sampling import SamplingParams
from specdec.serve.process import running_server

PROMPTS = [
    "Explain what a hash table is in three sentences.",
    "Write a short poem about the sea.",
    "List five countries in Europe and their capitals.",
    "Summarize the plot of Romeo and Juliet.",
    "Give three tips for writing clean Python code.",
    "What is the difference between a list and a tuple in Python?",
    "Describe how photosynthesis works.",
    "Translate 'good morning, how are you?' into French and Spanish.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--method", default="logitspec")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3, help="repeats per prompt for the overhead medians")
    p.add_argument("--prompts", type=int, default=3, help="prompts used for the overhead")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests-per-client", type=int, default=2)
    return p.parse_args(argv)


def chat_body(prompt: str, max_tokens: int, stream: bool = False) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    return {**body, "stream": stream, "stream_options": {"include_usage": True}} if stream else body


def server_call(http: httpx.Client, url: str, prompt: str, max_tokens: int) -> tuple[float, dict]:
    start = time.perf_counter()
    response = http.post(url + "/v1/chat/completions", json=chat_body(prompt, max_tokens))
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, response.json()


def library_call(engine: Engine, method: str, prompt: str, max_tokens: int) -> tuple[float, object]:
    """The server's work without the server: encode, build the proposer, generate."""
    settings = GenerationConfig(max_new_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
    start = time.perf_counter()
    prompt_ids = encode_prompt(engine.tokenizer, [{"role": "user", "content": prompt}], chat=True)
    output = engine.generate(prompt_ids, parse_method(method).build(engine.loaded), settings)
    return time.perf_counter() - start, output


def measure_overhead(args: argparse.Namespace, url: str, engine: Engine) -> dict:
    rows = []
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="library")

    def library(prompt: str) -> tuple[float, object]:
        return worker.submit(library_call, engine, args.method, prompt, args.max_tokens).result()

    with worker, httpx.Client(timeout=600) as http:
        for prompt in PROMPTS[: args.prompts]:
            server_call(http, url, prompt, args.max_tokens)  # warm both paths once
            library(prompt)
            server_s, library_s = [], []
            for _ in range(args.runs):
                seconds, reply = server_call(http, url, prompt, args.max_tokens)
                server_s.append(seconds)
                seconds, output = library(prompt)
                library_s.append(seconds)
                if reply["choices"][0]["message"]["content"] != output.text:
                    raise SystemExit(f"server and library disagree on {prompt!r}")
            rows.append({"prompt": prompt, "tokens": len(output.token_ids),
                         "server_s": statistics.median(server_s), "library_s": statistics.median(library_s)})  # fmt: skip
    overheads = [row["server_s"] - row["library_s"] for row in rows]
    return {"overhead_ms_median": 1000 * statistics.median(overheads), "per_prompt": rows}


def stream_client(url: str, prompts: list[str], max_tokens: int) -> int:
    """Send the prompts one after another (streaming); return the completion tokens received."""
    tokens = 0
    with httpx.Client(timeout=600) as http:
        for prompt in prompts:
            with http.stream("POST", url + "/v1/chat/completions", json=chat_body(prompt, max_tokens, True)) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        tokens += json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens


def measure_throughput(args: argparse.Namespace, url: str, num_clients: int) -> dict:
    per_client = [
        [PROMPTS[(i + j) % len(PROMPTS)] for j in range(args.requests_per_client)] for i in range(num_clients)
    ]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=num_clients) as pool:
        tokens = sum(pool.map(lambda prompts: stream_client(url, prompts, args.max_tokens), per_client))
    wall_s = time.perf_counter() - start
    requests = num_clients * args.requests_per_client
    return {"clients": num_clients, "requests": requests, "completion_tokens": tokens, "wall_s": wall_s,
            "tokens_per_s": tokens / wall_s, "requests_per_s": requests / wall_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    serve_args = ["--model", args.model, "--dtype", args.dtype, "--method", args.method,
                  "--max-queue", str(max(64, args.clients)), "--log-level", "warning"]  # fmt: skip
    log = Path(tempfile.mkdtemp(prefix="specdec-server-load-")) / "server.log"
    engine = Engine(load_model(args.model, dtype=args.dtype))
    with running_server(serve_args, log) as server:
        overhead = measure_overhead(args, server.url, engine)
        one = measure_throughput(args, server.url, 1)
        many = measure_throughput(args, server.url, args.clients)
    result = {"model": args.model, "method": args.method, "dtype": args.dtype, "max_tokens": args.max_tokens,
              "overhead": overhead, "throughput_1_client": one, f"throughput_{args.clients}_clients": many}  # fmt: skip
    print(f"overhead per request: {overhead['overhead_ms_median']:.1f} ms (median); tokens/s: "
          f"1 client {one['tokens_per_s']:.1f}, {args.clients} clients {many['tokens_per_s']:.1f}", file=sys.stderr)  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

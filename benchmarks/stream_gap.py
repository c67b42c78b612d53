"""How long a running stream stalls while a long prompt joins the server's batch, chunked and whole.

The server's scheduler (the same one `specdec serve` runs) decodes one streaming
request; once it has emitted a few tokens, a 3,000-token prompt is submitted. With
chunked prefill each step prefills one chunk and decodes the stream; with the
prompt in one piece (`--prefill-chunk` as large as the prompt: how the server ran
before chunking) the stream waits for the whole prefill. Printed per setting: the
stream's median gap between tokens before the prompt came, and its largest gap
while the prompt was being prefilled. Run it alone: these are wall-clock times.

    .venv/bin/python benchmarks/stream_gap.py --dtype bf16
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import make_config
from specdec.serve.metrics import ServerMetrics
from specdec.serve.scheduler import Job, Scheduler, TextEvent

PROMPT_TOKENS = 3000
NORMAL_STEPS = 8
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # greedy SmolLM2 counts on from here for hundreds of tokens


def counting_prompt(tokenizer, num_tokens: int) -> list[int]:  # noqa: ANN001 - a transformers tokenizer
    """`num_tokens` token ids of the counting text, repeated (a long prompt that costs a real prefill)."""
    counting = tokenizer.encode(COUNTING, add_special_tokens=False)
    return (counting * (num_tokens // len(counting) + 1))[:num_tokens]


def largest_gap(times: list[float], start: float, end: float) -> float:
    """The longest wait between `start`, each of `times` within [start, end], and `end`, in seconds."""
    edges = [start, *(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(edges, edges[1:], strict=False))


def measure(engine: Engine, tokenizer, prefill_chunk: int) -> tuple[float, float]:
    """(median gap before the long prompt, largest gap while it was prefilled), in seconds."""
    scheduler = Scheduler(engine, 4, ServerMetrics(), max_batch=2, prefill_chunk=prefill_chunk)
    scheduler.start()
    times: list[float] = []
    joined: list[float] = []
    done = threading.Event()

    def stream_sink(event) -> None:
        if isinstance(event, TextEvent):
            times.append(time.perf_counter())

    def long_sink(event) -> None:
        if not isinstance(event, TextEvent):
            joined.append(time.perf_counter())
            done.set()

    plain = make_config("plain", {})
    counting = tokenizer.encode(COUNTING, add_special_tokens=False)
    long = counting_prompt(tokenizer, PROMPT_TOKENS)
    stream = GenerationConfig(max_new_tokens=4000, ignore_eos=True)
    try:
        scheduler.submit(Job(counting, plain, "plain", stream, "completions", True, stream_sink))
        while len(times) < NORMAL_STEPS + 1:
            time.sleep(0.01)
        submitted = time.perf_counter()
        scheduler.submit(Job(long, plain, "plain", GenerationConfig(max_new_tokens=1), "completions", False,
                             long_sink))  # fmt: skip
        done.wait(600)
    finally:
        scheduler.close(60)
    normal = statistics.median(b - a for a, b in zip(times[:NORMAL_STEPS], times[1 : NORMAL_STEPS + 1], strict=True))
    return normal, largest_gap(times, submitted, joined[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--chunk", type=int, default=256, help="prefill chunk of the chunked setting")
    args = parser.parse_args()
    loaded = load_model(dtype=args.dtype)
    engine = Engine(loaded)
    print(f"{'prefill':<22}{'normal gap ms':>14}{'largest gap ms':>16}{'ratio':>8}")
    for label, chunk in ((f"chunks of {args.chunk}", args.chunk), ("whole prompt", PROMPT_TOKENS)):
        normal, largest = measure(engine, loaded.tokenizer, chunk)
        print(f"{label:<22}{normal * 1000:>14.1f}{largest * 1000:>16.1f}{largest / normal:>7.1f}x")


if __name__ == "__main__":
    main()

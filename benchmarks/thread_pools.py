"""Why the server loads its model off the main thread (`specdec.serve.model_thread`), measured.

    .venv/bin/python benchmarks/thread_pools.py

Two parts, each in its own child process so that no OpenMP pool leaks from one to the next:
- regions: microseconds per small parallel region (an in-place multiply over 200k floats), on
  threads before the main thread has run one, on the main thread, then on a thread after it;
- decoding: SmolLM2's plain decoding (default path, 128 tokens) on the main thread and on a worker
  thread, with the model loaded on the main thread (the server before) or on a thread that ended
  (the server now).
Prints one line per measurement; run it alone.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def regions() -> None:
    import torch

    x = torch.empty(200_000)

    def bench(tag: str) -> None:
        x.mul_(1.0)
        start = time.perf_counter()
        for _ in range(20_000):
            x.mul_(1.0)
        print(f"regions, {tag}: {1e6 * (time.perf_counter() - start) / 20_000:.1f} us", flush=True)

    for tag in ("a thread before the main thread ran one", "another such thread"):
        worker = threading.Thread(target=bench, args=(tag,))
        worker.start()
        worker.join()
    bench("the main thread")
    worker = threading.Thread(target=bench, args=("a thread after the main thread ran one",))
    worker.start()
    worker.join()


def decoding(load_where: str) -> None:
    from specdec.engine.generation import GenerationConfig
    from specdec.engine.loop import Engine
    from specdec.models import load_model
    from specdec.prompts import encode_prompt
    from specdec.proposers import parse_method

    def build():  # noqa: ANN202
        loaded = load_model("smollm2-135m")
        return loaded, Engine(loaded)

    if load_where == "main":
        loaded, engine = build()
    else:
        with ThreadPoolExecutor(1) as pool:
            loaded, engine = pool.submit(build).result()
    ids = encode_prompt(loaded.tokenizer, "Who played anna in once upon a time?", chat=True)
    config = GenerationConfig(max_new_tokens=128, ignore_eos=True)

    def run(tag: str) -> None:
        start = time.perf_counter()
        engine.generate(ids, parse_method("plain").build(loaded), config)
        ms = 1000 * (time.perf_counter() - start) / 128
        print(f"decoding, model loaded on {load_where}, run on {tag}: {ms:.2f} ms a token", flush=True)

    worker = threading.Thread(target=lambda: [run("a worker thread") for _ in range(3)])
    worker.start()
    worker.join()
    if load_where == "main":
        for _ in range(2):
            run("the main thread")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        regions() if sys.argv[1] == "regions" else decoding(sys.argv[2])
    else:
        for args in (["regions"], ["decoding", "main"], ["decoding", "a thread that ended"]):
            subprocess.run([sys.executable, __file__, *args], check=True)

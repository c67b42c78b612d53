"""`make demo`: the bundled model answers a Spec-Bench summarization prompt, streamed,
then every demo method runs the same prompt and a small table compares them.

The comparison is measured in this run, on this machine; nothing is hard-coded. Each method first answers
another question, so the table shows what a request gets once the method's one-off costs are paid and the
floor has learned this machine (what a second request, or a later run, gets: `specdec.engine.floor_store`).
"""

from __future__ import annotations

import sys

import torch

from specdec.backends.registry import load_model, path_line, verifies_exactly
from specdec.choices import BACKENDS, ModelSpec
from specdec.data import DataError, load_questions
from specdec.drafters.shipped import find_shipped_head
from specdec.engine.floor_store import remembered_floor
from specdec.engine.generation import GenerationConfig, GenerationOutput
from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers import METHODS, parse_method
from specdec.proposers.eagle import ARCHITECTURE as EAGLE3
from specdec.proposers.eagle import HeadError
from specdec.proposers.medusa import ARCHITECTURE as MEDUSA

FALLBACK_PROMPT = (
    "Summarize the following text in two sentences.\n\n"
    "Speculative decoding lets a cheap proposer guess several tokens ahead while the large model "
    "checks all the guesses in a single forward pass. Accepted guesses are kept and the first wrong "
    "one is replaced by the large model's own choice, so the output is exactly what the large model "
    "would have written on its own, only sooner."
)
DEMO_METHODS = ("plain", "pld", "logitspec", "eagle", "medusa")  # eagle, medusa where heads ship for the model
HEADS = {"eagle": EAGLE3, "medusa": MEDUSA}  # the methods that need a head, and its layout


def demo_prompt() -> str:
    try:
        return load_questions(categories=["summarization"], limit=1)[0].turns[0]
    except DataError:
        return FALLBACK_PROMPT


def run_demo(spec: ModelSpec | None = None, max_new_tokens: int = 128) -> None:
    spec = spec or ModelSpec()
    loaded = load_model(spec)
    backend = BACKENDS[spec.backend]
    engine = Engine(loaded, floor=remembered_floor(loaded))
    prompt = demo_prompt()
    prompt_ids = encode_prompt(loaded.tokenizer, prompt, chat=True)
    settings = GenerationConfig(max_new_tokens=max_new_tokens)
    # eagle and medusa where a head ships for the model and the verifier returns hidden states (not llama.cpp's)
    methods = [m for m in DEMO_METHODS if m in METHODS and (m not in HEADS or (backend.hidden_states and _ships(loaded, m)))]
    runs_on = f"{spec.backend}, {loaded.gguf_path.name}" if backend.gguf else f"{loaded.dtype}, {loaded.device}"
    print(f"model: {loaded.name} ({runs_on}); prompt: {len(prompt_ids)} tokens")
    print(f"path: {path_line(loaded)}")
    print(f"prompt (Spec-Bench summarization): {prompt[:160]!r}...\n")
    # Warm-up so the first timed method does not pay for one-off allocations.
    engine.generate(prompt_ids, parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
    _warm_up(engine, loaded, methods, min(64, max_new_tokens))
    results: dict[str, GenerationOutput] = {}
    for name in methods:
        stream = (lambda t: (sys.stdout.write(t), sys.stdout.flush())) if not results else None
        results[name] = engine.generate(prompt_ids, parse_method(name).build(loaded), settings, on_text=stream)
        if len(results) == 1:
            print("\n")
    # Batch-invariant verification makes this dtype's own comparison exact; otherwise float32 decides
    # (the same model reloaded in float32 on the eager pass). On a GGUF backend (llama.cpp) the reference
    # is its own plain decoding, in this run (exact with --exact on).
    check = not backend.gguf and loaded.dtype != torch.float32 and not verifies_exactly(loaded)
    exact = _fp32_identity(spec, prompt_ids, methods, max_new_tokens) if check else {}
    _print_table(results, loaded.dtype, exact)


def _warm_up(engine: Engine, loaded, methods: list[str], tokens: int) -> None:  # noqa: ANN001 - a LoadedModel
    """Each method first answers another question (`tokens` new tokens), as a second request would: it pays its one-off
    costs (a head's first call) and its floor learns this machine there, not in the timed run. What the floor
    learns carries to later runs anyway (`floor_store`); the first request of a method on a new machine is the
    one that pays for it."""
    try:
        other = load_questions(categories=["summarization"], limit=2)[1].turns[0]
    except (DataError, IndexError):
        other = FALLBACK_PROMPT
    other_ids = encode_prompt(loaded.tokenizer, other, chat=True)
    print(f"warm-up: each method first answers another question ({tokens} tokens), as a second request would",
          file=sys.stderr)
    for name in methods:
        engine.generate(other_ids, parse_method(name).build(loaded), GenerationConfig(max_new_tokens=tokens))


def _ships(loaded, method: str) -> bool:
    try:
        find_shipped_head(loaded, HEADS[method])
    except HeadError:
        return False
    return True


def _fp32_identity(spec: ModelSpec, prompt_ids: list[int], methods: list[str], max_new_tokens: int) -> dict[str, bool]:
    """Whether each method's greedy output equals plain decoding's in float32: the exact reference."""
    print(f"checking losslessness in float32 ({len(methods)} methods, {max_new_tokens} tokens each)...",
          file=sys.stderr)
    loaded = load_model(ModelSpec(spec.name, dtype="fp32", cache_dir=spec.cache_dir, device=spec.device))
    engine = Engine(loaded, attention="sdpa")  # a check, not a timing: no attention plan to measure
    settings = GenerationConfig(max_new_tokens=max_new_tokens)
    outputs = {name: engine.generate(prompt_ids, parse_method(name).build(loaded), settings) for name in methods}
    return {name: out.token_ids == outputs["plain"].token_ids for name, out in outputs.items()}


def _print_table(results: dict[str, GenerationOutput], dtype: torch.dtype, exact: dict[str, bool]) -> None:
    base = results["plain"]
    low = str(dtype).removeprefix("torch.")
    if exact:
        print(f"Speed is measured in {low}. {low} rounds a many-token verification pass differently from a "
              "one-token pass, so a near-tie token can flip and the texts drift apart: 'same output' in "
              f"{low} is about rounding, not the method. Losslessness is checked in float32, the exact "
              "reference, in the last column.\n")
    # Decode tokens/s: each method's prefill differs by what the prompt cache held (the warm-up's prompt is
    # this one) and by what a head captures, so the prefill is left out, as the benchmarks do.
    print("tokens/s: decoding only (the prompt's prefill left out)")
    header = f"{'method':<10} {'tokens':>6} {'tokens/s':>9} {'MAT':>5} {'speedup':>8} {'same output':>11}"
    print(header + (f" {'same in fp32':>12}" if exact else ""))
    for name, out in results.items():
        s, rate = out.stats, out.stats.decode_tokens_per_s
        speedup = rate / base.stats.decode_tokens_per_s if base.stats.decode_tokens_per_s else 0.0
        same = "yes" if out.token_ids == base.token_ids else "NO"
        row = f"{name:<10} {s.num_new_tokens:>6} {rate:>9.1f} {s.mat:>5.2f} {speedup:>7.2f}x {same:>11}"
        print(row + (f" {'yes' if exact[name] else 'NO':>12}" if exact else ""))

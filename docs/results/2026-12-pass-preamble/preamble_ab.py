"""In-process A/B of the fused pass's Python preamble: 'new' (a causal pass's positions, starts and counts as
views of one tensor, `fused._causal_rows`; the rotary tables grown to context + tokens) against 'old' (arange,
add, expand, contiguous, zeros and zeros_like; a tree pass reading its positions' maximum first), per generation
in turn, in one process.

Usage: python preamble_ab.py ROUNDS METHOD... (bundled SmolLM2, bf16, three chat prompts, 128 new tokens, the
first round dropped). Each generation starts from a fresh recycle table and no shared rates; the outputs and
every step's (nodes, accepted) are checked equal. Prints medians over generations, ms a step: step, the pass
(`FusedDecoder.run`, its preamble inside it), host (step - pass), and the preamble's part that changed (the causal
rows and the tree passes' maximum, timed where the pass calls them)."""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "2026-12-step-host"))
import hostsplit  # noqa: E402 - the pass timed by a wrapper
from inprocess_ab import use  # noqa: E402 - a fresh recycle table of the proposer's kind

from specdec.backends.torch import fused  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

VARIANTS = ("new", "old")
new_rows, new_run = fused._causal_rows, fused.FusedDecoder.run  # noqa: SLF001
changed = [0.0]  # seconds in the changed part of the preamble, this generation


def timed_rows(rows):  # noqa: ANN001, ANN201
    """`rows` (new or old), its time added to `changed`."""
    def call(*args):  # noqa: ANN002, ANN202
        start = time.perf_counter()
        try:
            return rows(*args)
        finally:
            changed[0] += time.perf_counter() - start
    return call


def old_rows(batch: int, tokens: int, context: int) -> tuple[torch.Tensor, ...]:
    """The preamble before: six ops for a causal pass's positions, starts, counts and tail."""
    positions = (context + torch.arange(tokens))[None].expand(batch, -1)
    starts = (positions + 1).contiguous()
    return positions, starts, torch.zeros_like(starts), torch.zeros(batch, tokens, 0, dtype=torch.int64)


def old_run(self, input_ids, position_ids, layout, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    """The run before: a tree pass read its positions' maximum to grow the rotary tables."""
    if layout is not None:
        start = time.perf_counter()
        int(position_ids.max())
        changed[0] += time.perf_counter() - start
    return new_run(self, input_ids, position_ids, layout, *args, **kwargs)


def main(rounds: int, methods: list[str]) -> None:
    loaded = load_model("smollm2-135m", dtype="bf16")
    engine, config = Engine(loaded), GenerationConfig(max_new_tokens=128, ignore_eos=True)
    prompts = [encode_prompt(loaded.tokenizer, text, chat=True) for text in hostsplit.PROMPTS]
    fused.FusedDecoder.run = hostsplit.timed_run
    for method in methods:
        rows: dict[str, list[tuple[float, ...]]] = {variant: [] for variant in VARIANTS}
        for round_ in range(rounds):
            for i, prompt in enumerate(prompts):
                seen = []
                for variant in VARIANTS if (round_ + i) % 2 == 0 else VARIANTS[::-1]:
                    fused._causal_rows = timed_rows(new_rows if variant == "new" else old_rows)  # noqa: SLF001
                    hostsplit.untimed = new_run if variant == "new" else old_run
                    loaded.state.clear()  # no rates shared from the generation before
                    proposer = parse_method(method).build(loaded)
                    use("new", proposer)
                    hostsplit.passes[0], changed[0] = 0.0, 0.0
                    start = time.perf_counter()
                    out = engine.generate(prompt, proposer, config)
                    wall, steps, passes = time.perf_counter() - start, out.stats.steps, hostsplit.passes[0]
                    seen.append((out.token_ids, [(s.tree_size, s.num_accepted) for s in steps]))
                    if round_:
                        n = len(steps)
                        rows[variant].append((wall / n, passes / n, (wall - passes) / n, changed[0] / n))
                assert seen[0] == seen[1], f"{method}: the variants decoded differently on prompt {i}"
        for variant, measured in rows.items():
            step, pass_, host, part = (statistics.median(column) * 1000 for column in zip(*measured, strict=True))
            print(f"{method:24s} {variant}: step {step:.3f} pass {pass_:.3f} host {host:.3f} changed {part:.3f} ms "
                  f"({len(measured)} generations)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])

"""In-process A/B of a step's host time (step less the pass): 'new' (this checkout) against 'old' (the top ids read by
the proposers themselves, the numpy recycle table, a fused tree pass's three key tensors), per generation in turn,
each with a fresh recycle table of its kind, so both decode the same trees (the outputs are checked equal).

Usage: python inprocess_ab.py METHOD ROUNDS old,new (bundled SmolLM2, bf16, three chat prompts, 128 tokens; the
first round dropped). Prints medians over generations, ms a step. 'mid': the new table and keys, the old tops.
The old table has no `expand`, so the `recycle` method itself is not measured here (LogitSpec's table is)."""

import dataclasses
import sys
import threading
import time

import numpy as np
import torch
from hostsplit import PROMPTS, passes, timed_run  # this folder's: the pass timed by a wrapper

import specdec.engine.batch as batch
from specdec.backends.registry import top_tokens
from specdec.backends.torch import fused
from specdec.engine import verify
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.recycle import RecycleTable


class OldTable:
    """The recycle table before: a [V, k] int32 array, -1 where unknown, written by fancy indexing."""

    def __init__(self, vocab_size: int, k: int) -> None:
        self.vocab_size, self.k = vocab_size, k
        self._successors = np.full((vocab_size, k), -1, dtype=np.int32)
        self._lock = threading.Lock()

    def update(self, tokens, logits: torch.Tensor, tops: np.ndarray | None = None) -> None:  # noqa: ANN001
        rows = tokens.cpu().numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
        width = min(self.k, self.vocab_size)
        if tops is not None and tops.shape == (rows.shape[0], tops.shape[1]) and tops.shape[1] >= width:
            top = tops[:, :width]
        else:
            top = top_tokens(logits, width).cpu().numpy()
        with self._lock:
            self._successors[rows, :width] = top

    def successors(self, token: int) -> list[int]:
        with self._lock:
            row = self._successors[token].tolist()
        return [t for t in row if t >= 0]


def old_of_trees(cls, trees, lengths, width):  # noqa: ANN001, ANN201
    """`KeySequences.of_trees` before: three tensors, the starts expanded and made contiguous."""
    lines = [[[start + node for node in line] for line in tree.ancestor_lines]
             + [[start + pad] for pad in range(tree.num_nodes, width)]
             for tree, start in zip(trees, lengths, strict=True)]
    longest = max(len(line) for row in lines for line in row)
    tail = [[slot for line in row for slot in line + [0] * (longest - len(line))] for row in lines]
    counts = [[len(line) for line in row] for row in lines]
    starts = torch.tensor(lengths, dtype=torch.int64)[:, None].expand(-1, width).contiguous()
    return cls(starts, torch.tensor(tail, dtype=torch.int64), torch.tensor(counts, dtype=torch.int64))


new_of_trees = fused.KeySequences.of_trees.__func__
new_verify = verify.verify


def old_verify(target, trees, draws, one_transfer=None, tops=None, every_node=None):  # noqa: ANN001, ANN201, ARG001
    """`verify` with no top ids asked: on the CPU each proposer reads its own, as before."""
    return new_verify(target, trees, draws, one_transfer, None)


def use(variant: str, proposer) -> None:  # noqa: ANN001
    """Switch the engine's paths to `variant` and give the proposer a fresh table of its kind."""
    batch.verify = old_verify if variant in ("old", "mid") else new_verify
    fused.KeySequences.of_trees = classmethod(old_of_trees if variant == "old" else new_of_trees)
    kind = OldTable if variant == "old" else RecycleTable
    sources = getattr(proposer, "sources", None)
    if sources is not None and sources.recycle is not None:
        proposer.sources = dataclasses.replace(sources, recycle=kind(sources.recycle.vocab_size, sources.recycle.k))
    if hasattr(proposer, "table"):
        proposer.table = kind(proposer.table.vocab_size, proposer.table.k)


def main(method: str, rounds: int, variants: list[str]) -> None:
    fused.FusedDecoder.run = timed_run
    loaded = load_model("smollm2-135m", dtype="bf16")
    prompts = [encode_prompt(loaded.tokenizer, text, chat=True) for text in PROMPTS]
    engine, config = Engine(loaded), GenerationConfig(max_new_tokens=128, ignore_eos=True)
    results: dict[str, list[tuple[float, float, float]]] = {variant: [] for variant in variants}
    outputs: dict[tuple[int, str], list[int]] = {}
    for round_ in range(rounds):
        for i, prompt in enumerate(prompts):
            for variant in variants if (round_ + i) % 2 == 0 else variants[::-1]:
                proposer = parse_method(method).build(loaded)
                use(variant, proposer)
                passes[0] = 0.0
                start = time.perf_counter()
                out = engine.generate(prompt, proposer, config)
                wall, steps = time.perf_counter() - start, out.stats.steps
                assert outputs.setdefault((i, variant), out.token_ids) == out.token_ids
                if round_:
                    n = len(steps)
                    results[variant].append(((wall - passes[0]) / n, wall / n, sum(s.draft_s for s in steps) / n))
    for i in range(len(prompts)):
        assert len({tuple(outputs[i, variant]) for variant in variants}) == 1, "the variants decoded differently"
    for variant, rows in results.items():
        host, step, propose = (sorted(column)[len(column) // 2] * 1000 for column in zip(*rows, strict=True))
        print(f"{method} {variant}: host {host:.3f} ms, step {step:.3f} ms, propose {propose:.3f} ms "
              f"(medians of {len(rows)} generations)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))

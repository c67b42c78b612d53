"""Where a decoding step's wall clock goes: engine step, proposing, the verification pass (its C++ layers and
its head), acceptance and bookkeeping, per step, on held-out Spec-Bench first turns (questions 11-12 of each
category), 128 new tokens, greedy, two rounds after a warm-up generation.

A measurement script, not product code: it wraps the engine's functions with timers in this process only.
The C++ parts are timed at the op: `decoder_pass` (every layer and the final norm; `decoder_layer` a layer
for a tree before the one-call pass) and the head's product (`q8_linear` / `q6_linear`), inside the
verification pass only (prompt passes left out). SRC picks the source tree.

Usage: step_parts.py [MODEL [METHOD]]   (default: smollm2-135m logitspec)
"""

import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch  # noqa: E402

import specdec.backends.torch.rows as rows  # noqa: E402
import specdec.engine.batch as batch  # noqa: E402
import specdec.engine.loop as loop  # noqa: E402
from specdec.data import load_questions  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.kernels import q4_kernel  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

totals: collections.Counter = collections.Counter()
inside = [False]  # within a verification pass


def timed(owner, name, label, only_inside=False):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if only_inside and not inside[0]:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
    method = sys.argv[2] if len(sys.argv) > 2 else "logitspec"
    loaded = load_model(model)
    engine = loop.Engine(loaded)
    q4_kernel.load_extension()
    timed(batch.Batch, "step", "step")
    timed(batch.Batch, "_propose", " propose")
    timed(batch, "verify", " verify (pass, acceptance, commit)")
    timed(rows.BatchedTarget, "commit", "  commit")
    timed(batch.Batch, "_advance", " advance (observe, emit)")
    pass_ = rows.BatchedTarget.verify_trees

    def verify_trees(*args, **kwargs):
        inside[0] = True
        start = time.perf_counter()
        try:
            return pass_(*args, **kwargs)
        finally:
            inside[0] = False
            totals["  the pass"] += time.perf_counter() - start

    rows.BatchedTarget.verify_trees = verify_trees
    for namespace, name, label in (("specdec_layer", "decoder_pass", "   layers and final norm (C++)"),
                                   ("specdec_layer", "decoder_layer", "   layers (C++)"),
                                   ("specdec_q4", "q8_linear", "   head (C++)"),
                                   ("specdec_q4", "q6_linear", "   head (C++)")):
        ops = getattr(torch.ops, namespace)
        if hasattr(ops, name):
            timed(ops, name, label, only_inside=True)
    seen: collections.Counter = collections.Counter()
    held = []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= 12:
            held.append(question)
    prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
    engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    for round_ in range(2):
        totals.clear()
        steps = nodes = 0
        for prompt in prompts:
            out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
            steps += out.stats.num_decode_steps
            nodes += sum(step.tree_size for step in out.stats.steps)
        print(f"round {round_}: {steps} steps, {nodes / steps:.2f} nodes a step")
        for label, seconds in sorted(totals.items(), key=lambda item: -item[1]):
            print(f"  {label:40s} {1e3 * seconds / steps:.3f} ms a step")


if __name__ == "__main__":
    main()

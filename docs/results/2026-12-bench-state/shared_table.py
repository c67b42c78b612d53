"""Does `recycle` gain from `logitspec`'s run of the same prompt when the two share one recycled-successor table?

`benchmarks/llamacpp_bench.py --interleave` runs every specdec method on a prompt before the next prompt, all
built from one loaded model with no state scope, and `logitspec`'s table and Token Recycling's (k = 8 both) are the
same object: so `recycle`, after `logitspec` on every prompt, drafted from successors the target had just given
for that very text. `specdec bench` scopes each method's state apart; this compares the two, one prompt at a time:
arm "shared" (both methods in one scope, logitspec first, as the bench script ran them) and arm "apart" (a scope
each), every arm on its own engine and floor, the arms alternating which goes first per prompt. Greedy, 128 new
tokens, bundled SmolLM2 on its default path, Spec-Bench first turns (the first `N` of each category).

Usage: python shared_table.py N. Prints, per arm and method: tokens a step (deterministic for given state), decode
tokens/s (prefill out), and whether every text equals the method's in the other arm."""

import dataclasses
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[3] / "benchmarks"))

from llamacpp_bench import prompts  # noqa: E402

from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

METHODS = ("logitspec", "recycle")


def main(per_category: int) -> None:
    loaded = load_model("smollm2-135m")
    work = [encode_prompt(loaded.tokenizer, text, chat=True) for _, text in prompts(per_category)]
    config = GenerationConfig(max_new_tokens=128)
    arms = {"shared": {m: "shared" for m in METHODS}, "apart": {m: f"apart-{m}" for m in METHODS}}
    engines = {arm: Engine(loaded, floor=Floor()) for arm in arms}
    warm = list(reversed(max(work, key=len)))  # as the bench script warms: the longest prompt reversed
    for arm, scopes in arms.items():
        for method in METHODS:
            engines[arm].generate(warm, parse_method(method).build(dataclasses.replace(loaded, state_scope=scopes[method])), config)
    totals = {(arm, m): [0, 0, 0.0] for arm in arms for m in METHODS}  # tokens, steps, decode seconds
    texts = {(arm, m): [] for arm in arms for m in METHODS}
    for i, ids in enumerate(work):
        for arm in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
            for method in METHODS:
                proposer = parse_method(method).build(dataclasses.replace(loaded, state_scope=arms[arm][method]))
                out = engines[arm].generate(ids, proposer, config)
                total = totals[(arm, method)]
                total[0] += len(out.token_ids) - 1
                total[1] += out.stats.num_decode_steps
                total[2] += out.stats.wall_time_s - out.stats.prefill_s
                texts[(arm, method)].append(out.token_ids)
    print(f"{len(work)} prompts, 128 new tokens, greedy")
    for arm in arms:
        for method in METHODS:
            tokens, steps, seconds = totals[(arm, method)]
            same = texts[(arm, method)] == texts[("apart" if arm == "shared" else "shared", method)]
            print(f"{arm:7s} {method:10s} tokens a step {tokens / steps:.3f}  decode tokens/s {tokens / seconds:.1f}  "
                  f"texts equal across arms {same}")


if __name__ == "__main__":
    started = time.time()
    main(int(sys.argv[1]))
    print(f"{time.time() - started:.0f} s")

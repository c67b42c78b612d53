"""EAGLE under the floor, its plain steps' passes capturing the target's features (A, as before) or not (B).

    .venv/bin/python benchmarks/head_plain_steps.py

Per held-out prompt in turn (Spec-Bench questions 11-12 of each category, first turns; the order rotates): `plain`,
A and B, 128 new tokens, greedy, each on an engine with its own floor; A sets `EagleProposer.features_optional`
off, which is how every pass captured before. Prints the median per-prompt ratio to `plain`, the mean decode
tokens/s and the median verify time of one-node steps, after each of three rounds. Run it alone.
"""

import statistics
import sys

sys.path.insert(0, "src")
sys.path.insert(0, "benchmarks")
from kernel_paths import held_out_prompts  # noqa: E402

from specdec.backends.registry import load_model  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.proposers.eagle.proposer import EagleProposer  # noqa: E402

VARIANTS = {"plain": ("plain", True), "A": ("eagle", False), "B": ("eagle", True)}  # name -> (method, optional)


def once(loaded, engine: Engine, name: str, prompt: list[int], tokens: int = 128) -> tuple[float, float, list[int]]:  # noqa: ANN001
    """Decode tokens/s, the median verify seconds of one-node steps, and the tokens."""
    method, optional = VARIANTS[name]
    EagleProposer.features_optional = optional
    out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=tokens))
    one_node = [step.verify_s for step in out.stats.steps if step.tree_size == 1]
    rate = (out.stats.num_new_tokens - 1) / (out.stats.wall_time_s - out.stats.prefill_s)
    return rate, statistics.median(one_node), out.token_ids


def main() -> None:
    loaded = load_model("smollm2-135m")
    prompts = held_out_prompts(loaded.tokenizer)
    engines = {name: Engine(loaded, floor=Floor()) for name in VARIANTS}
    for name in VARIANTS:  # warm-up: the cost curve, each engine's first passes
        once(loaded, engines[name], name, prompts[0], 16)
    rates = {name: [] for name in VARIANTS}
    passes = {name: [] for name in VARIANTS}
    order, same = list(VARIANTS), 0
    for round_ in range(3):
        for prompt in prompts:
            order = order[1:] + order[:1]
            texts = {}
            for name in order:
                rate, one_node, texts[name] = once(loaded, engines[name], name, prompt)
                rates[name].append(rate)
                passes[name].append(one_node)
            same += texts["A"] == texts["plain"] == texts["B"]
        for name in VARIANTS:
            ratio = statistics.median(a / b for a, b in zip(rates[name], rates["plain"], strict=True))
            print(f"after round {round_}: {name}: median x plain {ratio:.3f}, mean tok/s {statistics.mean(rates[name]):.1f}, "
                  f"median one-node verify {1e3 * statistics.median(passes[name]):.2f} ms", flush=True)
    print("texts equal in all three:", same, "of", 3 * len(prompts))


if __name__ == "__main__":
    main()

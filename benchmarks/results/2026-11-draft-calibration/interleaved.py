"""Arms interleaved per prompt: each arm has its own loaded model (so its own shared rates), its own Engine and
Floor; every held-out prompt (Spec-Bench questions FIRST..LAST of each category, default 11-20) runs on every arm
in turn, the order rotating by prompt, so the machine's drift over minutes hits every arm alike.

    METHOD=logitspec OUT=rows.jsonl .venv/bin/python interleaved.py ARM[,ARM...]

ARM: `plain`; `nofloor...` (no floor); any other name with the floor; NAME=K:V;K:V sets floor constants for
that arm (V a Python literal, a tuple as 4|16); EXCL:0 turns off the planner's exclusive siblings. Prints
each arm's decode tokens/s by category as a multiple of `plain`'s, the share of steps with a tree, tokens/s.
"""

import collections
import json
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions  # noqa: E402
from specdec.engine import floor as F  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.proposers.logitspec import plan as P  # noqa: E402

EXCLUSIVE = P.NodePool.exclusive_probs
FIRST, LAST = int(os.environ.get("FIRST", 11)), int(os.environ.get("LAST", 20))
METHOD = os.environ.get("METHOD", "logitspec")
CONSTANTS = ("DRAFT_RUN", "EXPLORE", "DECAY", "MARGIN", "TRY_SHARE", "TRY_GAP_MAX", "SETTLE", "WARMUP")
DEFAULTS = {name: getattr(F, name) for name in CONSTANTS}


def parse_value(text: str) -> object:
    return tuple(int(part) for part in text.split("|")) if "|" in text else eval(text)  # noqa: S307


def make_arms(specs: str) -> list[tuple]:
    arms = []
    for spec in specs.split(","):
        name, _, consts = spec.partition("=")
        over = {key: parse_value(value) for key, value in (kv.split(":") for kv in consts.split(";") if kv)}
        loaded = load_model("smollm2-135m")
        floor = None if name == "plain" or name.startswith("nofloor") else F.Floor()
        arms.append((name, "plain" if name == "plain" else METHOD, over, loaded, Engine(loaded, floor=floor)))
    return arms


def held_out(tokenizer) -> list[tuple[str, list[int]]]:
    seen, held = collections.Counter(), []
    for question in load_questions():
        seen[question.category] += 1
        if FIRST <= seen[question.category] <= LAST:
            held.append((question.category, encode_prompt(tokenizer, question.turns[0], chat=True)))
    return held


def rate(totals: dict, categories: list[str]) -> float:
    return sum(totals[c][0] for c in categories) / sum(totals[c][1] for c in categories)


def main(specs: str) -> None:
    arms = make_arms(specs)
    held = held_out(arms[0][3].tokenizer)
    for _, _, _, loaded, engine in arms:
        engine.generate(held[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
    total = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0, 0, 0]))
    with open(os.environ.get("OUT", os.devnull), "a") as rows:
        for i, (category, prompt) in enumerate(held):
            for name, method, over, loaded, engine in arms[i % len(arms) :] + arms[: i % len(arms)]:
                for key, value in {**DEFAULTS, **over}.items():
                    if key != "EXCL":
                        setattr(F, key, value)
                P.NodePool.exclusive_probs = EXCLUSIVE if over.get("EXCL", 1) else (lambda pool: pool.probs)
                out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
                stats, entry = out.stats, total[name][category]
                entry[0] += stats.num_new_tokens - 1
                entry[1] += stats.wall_time_s - stats.prefill_s
                entry[2] += sum(step.tree_size > 1 for step in stats.steps)
                entry[3] += len(stats.steps)
                steps = [(step.tree_size, step.num_accepted) for step in stats.steps]
                rows.write(json.dumps(dict(arm=name, cat=category, i=i, new=stats.num_new_tokens - 1,
                                           decode_s=stats.wall_time_s - stats.prefill_s, steps=steps)) + "\n")
            if (i + 1) % 12 == 0:
                print(f"{i + 1} prompts", flush=True)
    categories = list(dict.fromkeys(category for category, _ in held))
    base = total["plain"]
    print("arm        " + " ".join(f"{c[:8]:>8s}" for c in categories) + "  overall  share  tok/s")
    for name, *_ in arms:
        mine = total[name]
        shares = sum(mine[c][2] for c in categories) / sum(mine[c][3] for c in categories)
        print(f"{name:10s} " + " ".join(f"{rate(mine, [c]) / rate(base, [c]):8.3f}" for c in categories)
              + f"  {rate(mine, categories) / rate(base, categories):7.3f}  {shares:.2f}  {rate(mine, categories):6.1f}")


if __name__ == "__main__":
    main(sys.argv[1])

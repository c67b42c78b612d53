"""One arm of this folder's A/B scripts: `plain` and a method on each held-out turn (Spec-Bench questions 11-20 of
each category, never the reported first 10), in alternating order, on a fresh floor; texts checked equal to plain's.

`setup()` loads the model and the turns; `run_arm()` returns one printable line: decode tokens/s of plain, the
method's x plain, its drafting steps' share, nodes and tokens a drafting step, ms a drafting and a plain step, and
x plain by category.
"""

import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_turns

from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method

CONFIG = GenerationConfig(max_new_tokens=128)


def setup(last: int = 20):
    """(loaded model, an engine warmed up, held-out turns as (category, prompt ids))."""
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded)
    turns = held_out_turns(loaded, int(os.environ.get("LAST", last)))
    engine.generate(turns[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
    return loaded, engine, turns


def run_arm(loaded, engine, turns, method: str, floor: Floor | None = None) -> str:
    engine.floor = floor or Floor()
    tokens, seconds = collections.Counter(), collections.Counter()
    steps = collections.Counter()
    for i, (category, prompt) in enumerate(turns):
        texts = {}
        for name in ["plain", method] if i % 2 else [method, "plain"]:
            out = engine.generate(prompt, parse_method(name).build(loaded), CONFIG)
            texts[name] = out.token_ids
            for key in (name, (name, category)):
                tokens[key] += out.stats.num_new_tokens
                seconds[key] += out.stats.wall_time_s - out.stats.prefill_s
            if name == method:
                for step in out.stats.steps:
                    drafted = step.tree_size > 1
                    steps["all"] += 1
                    steps["drafting" if drafted else "plain"] += 1
                    steps["time drafting" if drafted else "time plain"] += step.draft_s + step.verify_s
                    if drafted:
                        steps["nodes"] += step.tree_size
                        steps["tokens"] += step.num_accepted + 1
        assert texts[method] == texts["plain"], category

    def ratio(key):
        plain_key = "plain" if key == method else ("plain", key[1])
        return tokens[key] / seconds[key] / (tokens[plain_key] / seconds[plain_key])

    drafting, plain = max(steps["drafting"], 1), max(steps["plain"], 1)
    by_category = " ".join(f"{c[:5]} {ratio((method, c)):.2f}" for c in sorted({c for c, _ in turns}))
    return (
        f"plain {tokens['plain'] / seconds['plain']:.1f}, {method} {ratio(method):.3f}x; drafting steps "
        f"{steps['drafting'] / steps['all']:.2f}, nodes {steps['nodes'] / drafting:.2f}, tokens "
        f"{steps['tokens'] / drafting:.2f}, ms a drafting step {1e3 * steps['time drafting'] / drafting:.2f}, "
        f"plain step {1e3 * steps['time plain'] / plain:.2f} | {by_category}"
    )

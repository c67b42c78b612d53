"""Where LogitSpec's work around the pass goes, timed in place: each piece of its proposal and of its learning,
in microseconds a decode step, on held-out turns (Spec-Bench questions 11-12 of each category), no floor.

    SRC=path/to/src .venv/bin/python proposal_parts.py

Each piece is the proposer's own function wrapped by a timer (a few tenths of a microsecond each); the same
functions timed alone run several times faster (`first_call.py`): what a piece costs is what it costs here.
"""

import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts, spent, timed  # noqa: E402 - the same timing wrapper

from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.proposers import pld as PLD  # noqa: E402
from specdec.proposers import recycle as RC  # noqa: E402
from specdec.proposers.logitspec import plan as PL  # noqa: E402
from specdec.proposers.logitspec import proposer as P  # noqa: E402

PIECES = (("propose", P.LogitSpecProposer, "propose"), ("  synced_index", P, "synced_index"),
          ("  pld.draft", PLD.PLDProposer, "draft"), ("  retrieve", P, "retrieve"),
          ("  add_floor", P.LogitSpecProposer, "_add_floor"), ("  add_candidates", P.LogitSpecProposer, "_add_candidates"),
          ("  other_sources", P.LogitSpecProposer, "_add_other_sources"), ("  plan", PL.NodePool, "plan"),
          ("  tree", PL.NodePool, "tree"), ("observe", P.LogitSpecProposer, "observe"),
          ("  recycle.update", RC.RecycleTable, "update"), ("  count_sources", P, "count_sources"),
          ("  learn_step", P, "learn_step"))


def main() -> None:
    for name, owner, attr in PIECES:
        timed(name, owner, attr)
    loaded = load_model("smollm2-135m")
    held = held_out_prompts(loaded)
    engine, config = Engine(loaded), GenerationConfig(max_new_tokens=128)
    for prompt in held[:3]:  # warm-up, and rates learned
        engine.generate(prompt, parse_method("logitspec").build(loaded), config)
    spent.clear()
    steps = sum(engine.generate(p, parse_method("logitspec").build(loaded), config).stats.num_decode_steps
                for p in held)
    print(f"{steps} steps")
    for name, *_ in PIECES:
        print(f"{name:18s} {1e6 * spent[name] / steps:7.1f} us")


if __name__ == "__main__":
    main()

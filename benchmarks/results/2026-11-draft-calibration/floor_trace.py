"""The floor's choices step by step on three held-out prompts of one category (Spec-Bench questions 11-13),
logitspec: mode and tree size, tokens, milliseconds, both rates (tokens/ms), the leader and the try schedule.

    RUN=4 .venv/bin/python floor_trace.py summarization   (RUN: the floor's DRAFT_RUN)
"""

import collections
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

observe = F.FloorState.observe


def traced(state, drafted, tokens, seconds, nodes=1):
    observe(state, drafted, tokens, seconds, nodes)
    draft, plain = state.drafting.value or 0.0, state.plain.value or 0.0
    print(f"{'D' if drafted else 'p'}{nodes:<2d} t{tokens} {seconds * 1e3:5.2f}ms  rates d {draft / 1e3:.3f} "
          f"p {plain / 1e3:.3f} lead {state.leader} gap {state.gap} since {state.since}")


def main(category: str) -> None:
    F.DRAFT_RUN = int(os.environ.get("RUN", F.DRAFT_RUN))
    F.FloorState.observe = traced
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded, floor=F.Floor())
    seen, held = collections.Counter(), []
    for question in load_questions():
        seen[question.category] += 1
        if question.category == category and 11 <= seen[question.category] <= 13:
            held.append(encode_prompt(loaded.tokenizer, question.turns[0], chat=True))
    for prompt in held:
        print("=== row")
        engine.generate(prompt, parse_method("logitspec").build(loaded), GenerationConfig(max_new_tokens=128))


if __name__ == "__main__":
    main(sys.argv[1])

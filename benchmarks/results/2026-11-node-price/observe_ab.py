"""logitspec's plain (floor-gated) steps with and without the recycle table's update, ABBA in one process on
held-out turns (Spec-Bench questions 11-20), fresh floor an arm; x plain per arm."""

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
from specdec.proposers.logitspec.proposer import MAX_HEAT, LogitSpecProposer, count_sources, learn_step

new_observe = LogitSpecProposer.observe


def old_observe(self, result):
    step, self._last = self._last, None
    heat, self._heat = self._heat, min(result.num_accepted, MAX_HEAT)
    if self.sources.recycle is not None:
        self.sources.recycle.update(result.tree.tokens, result.target_logits)
    if step is None:
        return
    count_sources(self.source_stats, step.sources, result.path)
    learn_step(self.stats, step, result.tree.token_list[0], result.tokens, heat)


method = sys.argv[1] if len(sys.argv) > 1 else "logitspec"
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
turns = held_out_turns(loaded, 20)
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for arm in ("old", "new", "new", "old"):
    LogitSpecProposer.observe = old_observe if arm == "old" else new_observe
    engine.floor = Floor()
    rates = collections.defaultdict(lambda: [0, 0.0])
    steps = collections.Counter()
    for i, (_, prompt) in enumerate(turns):
        texts = {}
        for m in ["plain", method] if i % 2 else [method, "plain"]:
            out = engine.generate(prompt, parse_method(m).build(loaded), config)
            texts[m] = out.token_ids
            rates[m][0] += out.stats.num_new_tokens
            rates[m][1] += out.stats.wall_time_s - out.stats.prefill_s
            steps[m] += out.stats.num_decode_steps
        assert texts[method] == texts["plain"]
    base = rates["plain"][0] / rates["plain"][1]
    r = rates[method][0] / rates[method][1]
    print(
        f"{arm}: plain {base:.1f}, {method} {r:.1f} ({r / base:.3f}x), tokens a step {rates[method][0] / steps[method]:.2f}",
        flush=True,
    )

# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""The step's C++ calls against the Python they replaced, in one process, in turn: greedy acceptance's walk
(`greedy_walk`), the commit's KV moves (`keep_paths`), a pass's embedding and rotary rows (`pass_inputs`) and the
text stream's decode. The old arm runs each replaced path as it ran before (the Python fallbacks the changes
keep); the new arm the default. Held-out turns (Spec-Bench questions 11-12 of each category), 128 new tokens,
greedy, no floor (the same trees in both arms: the texts, steps and tokens are checked equal); ABAB... rounds.
Per method and arm: decode tokens/s, ms a step, and ms a step outside the verification pass (the breakdown's
`verify_trees`) and inside it outside its two C++ calls."""
import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
import torch
import torch._ops
from batch_steps import held_out_prompts

from specdec import text
from specdec.backends.torch import rows
from specdec.engine import accept, loop
from specdec.engine.generation import GenerationConfig
from specdec.models import load_model
from specdec.proposers import parse_method

spent: collections.Counter = collections.Counter()


in_pass: list[bool] = [False]  # a verification pass is running (prefills' C++ calls are not counted)


def timed(name, function, only_inside=False):
    def wrapper(*args, **kwargs):
        start, outer = time.perf_counter(), in_pass[0]
        in_pass[0] = outer or name == "pass"
        try:
            return function(*args, **kwargs)
        finally:
            in_pass[0] = outer
            if outer or not only_inside:
                spent[name] += time.perf_counter() - start
    return wrapper


def old_keep_paths(layers, row_list, src, dst):
    """The commit as it ran before: indexed copies per layer and buffer."""
    row_index = torch.tensor(row_list)[:, None]
    src_index, dst_index = torch.tensor(src), torch.tensor(dst)
    for layer in layers:
        layer.keep_paths(row_index, src_index, dst_index)


new_walk, new_keep, new_decode = accept.greedy_walk, rows.keep_paths, text._backend_decode
rows.BatchedTarget.verify_trees = timed("pass", rows.BatchedTarget.verify_trees)
torch._ops.TorchBindOpOverload.__call__ = timed("C", torch._ops.TorchBindOpOverload.__call__, True)
loaded = load_model("smollm2-135m")
engine = loop.Engine(loaded)
fused = engine.target._fused  # the one-sequence target the batch rows run on
torch.ops.specdec_q4.q8_linear = timed("C", torch.ops.specdec_q4.q8_linear, True)
assert fused is not None


def arm(old: bool) -> None:
    accept.greedy_walk = (lambda *args: None) if old else new_walk
    rows.keep_paths = old_keep_paths if old else new_keep
    text._backend_decode = (lambda tokenizer: None) if old else new_decode
    fused.direct = not old


prompts = held_out_prompts(loaded, 1000)  # Spec-Bench questions 11-12 of each category
outputs: dict = {}
for method in sys.argv[1:] or ["plain", "logitspec"]:
    engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    for round_ in range(int(os.environ.get("ROUNDS", "3"))):
        for name in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            arm(name == "old")
            spent.clear()
            tokens = steps = 0
            decode = 0.0
            texts = []
            for prompt in prompts:
                out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
                tokens += out.stats.num_new_tokens
                steps += out.stats.num_decode_steps
                decode += out.stats.wall_time_s - out.stats.prefill_s
                texts.append(out.token_ids)
            assert outputs.setdefault(method, texts) == texts, "the arms emitted different tokens"
            around = decode - spent["pass"]
            inside = spent["pass"] - spent["C"]
            print(f"{method} {name} round {round_ + 1}: {tokens / decode:.1f} tok/s, {1e3 * decode / steps:.3f} ms a step "
                  f"({steps} steps); outside the pass {1e3 * around / steps:.3f} ms, in the pass outside C++ "
                  f"{1e3 * inside / steps:.3f} ms", flush=True)
arm(False)

"""`benchmarks/llamacpp_bench.py` runs every specdec method on a prompt before the next: each method's state that
outlives a request must be its own, or `recycle` drafts from the successors `logitspec` just recorded for the same
text (docs/results/2026-12-bench-state)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers.logitspec.learn import RECYCLE_K
from specdec.proposers.recycle import RecycleTable

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "llamacpp_bench.py"


def _script():
    spec = importlib.util.spec_from_file_location("llamacpp_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_each_method_of_the_bench_script_learns_into_its_own_table(default_model):
    ids = encode_prompt(default_model.tokenizer, "Name three rivers of Europe.", chat=True)
    _script().run_specdec(Engine(default_model), "logitspec", ids, 6)

    def table(scope: str) -> RecycleTable:
        return RecycleTable.for_loaded(dataclasses.replace(default_model, state_scope=scope), RECYCLE_K)

    assert any(table("logitspec").successors(t) for t in ids)
    assert not any(table("recycle").successors(t) for t in ids)

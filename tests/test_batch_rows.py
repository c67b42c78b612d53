"""Eight rows in one batch through the one engine: each row is plain decoding's output (fp32 greedy).

The lossless matrix (`test_lossless.py`) runs every method through `Engine.generate`, a batch of
one. Here each method's fast matrix case serves eight prompts of every category at once, with the
fixed cost curve of conftest, so the node budget cuts trees, rows are padded to the widest tree, and
rows leave at different steps (different `max_new_tokens`) while the others go on.
"""

from __future__ import annotations

import pytest
from test_lossless import CASES, GREEDY, stdlib_datastore  # noqa: F401 (a fixture some cases build on)

from specdec.engine.costs import load_or_measure
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import generate_batch
from specdec.proposers.plain import PlainProposer

NEW_TOKENS = 32
ROWS = (  # (category, max_new_tokens): rows finish at different steps
    ("translation", 32), ("mt_bench", 8), ("qa", 24), ("math_reasoning", 32),
    ("summarization", 16), ("rag", 32), ("counting", 32), ("mt_bench", 4),
)  # fmt: skip
ONE_CASE_PER_METHOD = {
    case.name.split(":")[0].split("-")[0]: case for case in CASES if case.fast and case.rows[0][1] == GREEDY
}
FAST = {"plain"}  # the other methods run in the full tier (make test-all)


def builder(method: str):
    if method == "plain":
        return lambda request: PlainProposer()
    return ONE_CASE_PER_METHOD[method].build


METHODS = [
    pytest.param(name, marks=() if name in FAST else pytest.mark.slow)
    for name in ["plain", *sorted(ONE_CASE_PER_METHOD)]
]


@pytest.mark.parametrize("method", METHODS)
def test_a_batch_of_eight_rows_each_equal_plain(
    engine, default_model, bench_prompts, plain_runs, request, method
):
    build = builder(method)
    prompts = [bench_prompts[category] for category, _ in ROWS]
    configs = [GenerationConfig(max_new_tokens=n) for _, n in ROWS]
    proposers = [build(request) for _ in ROWS]
    costs = load_or_measure(default_model)  # conftest's fixed curve: the node budget cuts trees
    outs = generate_batch(engine, prompts, proposers, configs, costs=costs, max_batch=8)
    expected = [plain_runs.tokens(category, NEW_TOKENS, GREEDY)[:n] for category, n in ROWS]
    assert [out.token_ids for out in outs] == expected
    assert max(out.stats.num_decode_steps for out in outs) > 0

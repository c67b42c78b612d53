"""Batched speculative decoding on the real default model (fp32): every row equals its prompt run alone.

Rows differ in prompt length (Spec-Bench prompts of every category) and in
max_new_tokens (rows finish early), and there are more prompts than batch slots
(rows join mid-run as others leave). The fixed cost curve of conftest makes the
planner cut trees, so the identity checks cover cut trees too.
"""

from __future__ import annotations

import pytest
import torch

from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.data import load_questions
from specdec.engine.costs import CostModel, load_or_measure
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import generate_batch
from specdec.engine.planner import EXPLORE_EVERY, RowRates, cut, plan_width
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.draft import DraftConfig
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

LENGTHS = (12, 4, 10, 1, 8)  # max_new_tokens per prompt: rows end at different steps


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset)  # every category
    return [encode_prompt(default_model.tokenizer, q.turns[0], chat=True) for q in questions][: len(LENGTHS)]


@pytest.fixture(scope="module")
def costs(default_model):
    return load_or_measure(default_model)  # conftest's fixed curve: no timing in tests


def _configs(sampling: SamplingParams | None = None) -> list[GenerationConfig]:
    return [GenerationConfig(max_new_tokens=n, sampling=sampling or SamplingParams()) for n in LENGTHS]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["plain", "pld", "logitspec", "logitspec:adaptive=false", "lookahead"])
def test_every_row_equals_its_prompt_alone(engine, default_model, prompts, costs, method):
    configs = _configs()
    alone = [
        engine.generate(p, parse_method(method).build(default_model), c)
        for p, c in zip(prompts, configs, strict=True)
    ]
    proposers = [parse_method(method).build(default_model) for _ in prompts]
    batched = generate_batch(engine, prompts, proposers, configs, costs=costs, max_batch=4)
    assert [out.token_ids for out in batched] == [out.token_ids for out in alone]
    assert [out.finish_reason for out in batched] == [out.finish_reason for out in alone]
    assert [out.text for out in batched] == [out.text for out in alone]


@pytest.mark.slow
def test_draft_model_rows_with_cut_chains_stay_identical(engine, default_model, prompts, costs):
    """A draft model's chain cut by the planner leaves the draft's own cache ahead: it must roll back."""
    configs = _configs()[:3]
    make = lambda: DraftConfig(k=4, adaptive=False).build_with(default_model, default_model.model)  # noqa: E731
    alone = [engine.generate(p, make(), c).token_ids for p, c in zip(prompts[:3], configs, strict=True)]
    batched = generate_batch(
        engine, prompts[:3], [make() for _ in configs], configs, costs=costs, max_batch=2
    )
    assert [out.token_ids for out in batched] == alone
    assert sum(out.stats.num_decode_steps for out in batched) < sum(
        len(t) for t in alone
    )  # drafts were accepted


def test_seeded_sampling_does_not_depend_on_the_batch(engine, default_model, prompts, costs):
    sampling = SamplingParams(temperature=1.0, seed=7)
    config = GenerationConfig(max_new_tokens=12, sampling=sampling)
    solo = generate_batch(
        engine, prompts[:1], [parse_method("pld").build(default_model)], [config], costs=costs
    )
    others = [
        GenerationConfig(max_new_tokens=8, sampling=SamplingParams(temperature=1.0, seed=s)) for s in (1, 2)
    ]
    mixed = generate_batch(
        engine,
        prompts[:3],
        [parse_method("pld").build(default_model) for _ in range(3)],
        [config, *others],
        costs=costs,
    )
    assert mixed[0].token_ids == solo[0].token_ids
    assert mixed[1].token_ids != mixed[2].token_ids or mixed[1].text != mixed[2].text


def test_seeded_sampled_rows_emit_plain_sampling(engine, default_model, prompts, costs):
    """Tokens drawn by output position (engine.uniforms): a row's trees, cut or not, change nothing."""
    configs = [GenerationConfig(n, SamplingParams(temperature=0.8, seed=n)) for n in LENGTHS]
    plain = [engine.generate(p, PlainProposer(), c).token_ids for p, c in zip(prompts, configs, strict=True)]
    proposers = [parse_method("logitspec").build(default_model) for _ in prompts]
    batched = generate_batch(engine, prompts, proposers, configs, costs=costs, max_batch=3)
    assert [out.token_ids for out in batched] == plain


def test_rows_join_mid_run_and_cancelled_rows_leave(engine, default_model, prompts, costs):
    config = GenerationConfig(max_new_tokens=10)
    expected = [engine.generate(p, PlainProposer(), config).token_ids for p in prompts[:3]]
    batch = engine.batch(costs, max_batch=3)
    first = batch.add(prompts[0], PlainProposer(), config)
    doomed = batch.add(prompts[2], PlainProposer(), config)
    for _ in range(4):
        batch.step()
    batch.cancel(doomed)  # its slot is filled by the last row; the others must not notice
    late = batch.add(prompts[1], PlainProposer(), config)
    batch.run()
    assert first.output.token_ids == expected[0]
    assert late.output.token_ids == expected[1]
    assert doomed.output is None and doomed.cancelled


def test_a_failing_proposer_ends_only_its_own_row(engine, default_model, prompts, costs):
    class Broken(PlainProposer):
        def propose(self, ctx):
            raise RuntimeError("broken proposer")

    config = GenerationConfig(max_new_tokens=8)
    batch = engine.batch(costs)
    good = batch.add(prompts[0], PlainProposer(), config)
    bad = batch.add(prompts[1], Broken(), config)
    batch.run()
    assert isinstance(bad.error, RuntimeError) and bad.output is None
    assert good.output.token_ids == engine.generate(prompts[0], PlainProposer(), config).token_ids


def test_batched_target_matches_one_sequence_targets_and_grows(default_model, prompts):
    """Trees of different shapes per row, commits of branch paths, a removed row, a cache past its capacity."""
    model = default_model.model
    batched = BatchedTarget(TargetModel(model))
    for layer in batched.cache.layers:
        layer.initial_capacity = 8  # every row outgrows it: the buffers must double with contents kept
    singles = [TargetModel(model) for _ in range(3)]
    for target, prompt in zip(singles, prompts[:3], strict=True):
        row, logits, _ = batched.add(prompt)
        torch.testing.assert_close(logits, target.prefill(prompt))
    steps = [
        (
            [DraftTree.from_branches(5, [[1, 2, 3], [4, 5]]), DraftTree.chain(7, [8]), DraftTree.chain(9)],
            [[0, 4, 5], [0, 1], [0]],
        ),
        (
            [DraftTree.chain(3, [4, 5]), DraftTree.from_branches(6, [[1], [2, 3]]), DraftTree.chain(2, [1])],
            [[0], [0, 2, 3], [0, 1]],
        ),
    ]
    for trees, paths in steps:
        got = batched.verify_trees(trees)
        for target, tree, (logits, _) in zip(singles, trees, got, strict=True):
            torch.testing.assert_close(
                logits, target.forward_tree(tree.tokens, tree.parents), atol=1e-3, rtol=1e-4
            )
        batched.commit(paths)
        for target, path in zip(singles, paths, strict=True):
            target.commit(path)
    assert batched.remove(0) == 2  # the last row took slot 0
    del singles[0]
    singles = [singles[1], singles[0]]
    trees = [DraftTree.chain(11, [12]), DraftTree.chain(13)]
    for target, tree, (logits, _) in zip(singles, trees, batched.verify_trees(trees), strict=True):
        torch.testing.assert_close(
            logits, target.forward_tree(tree.tokens, tree.parents), atol=1e-3, rtol=1e-4
        )


def test_planner_spends_the_width_where_drafts_are_accepted():
    flat = [1e-3, 1e-3, 1e-3]
    cost = lambda n: 1.0 + 0.1 * n  # noqa: E731
    assert plan_width([[1.0, *flat], [1.0, *flat]], [False, False], cost) == 1  # drafts that never pay
    assert plan_width([[1.0, 0.9, 0.8, 0.7], [1.0, 0.9, 0.8, 0.7]], [False, False], cost) == 4
    assert (
        plan_width([[1.0, *flat], [1.0, 0.9, 0.8, 0.7, 0.6]], [True, False], cost) >= 4
    )  # fixed tree kept whole
    tree = DraftTree.from_branches(1, [[2, 3, 4], [5]])
    assert cut(tree, 3).token_list == [1, 2, 3] and cut(tree, 3).parent_list == [-1, 0, 1]
    rates = RowRates()
    before = rates.node_probs(tree)
    for _ in range(20):
        rates.observe(tree, [0, 1, 2, 3])  # the first branch always accepted, the sibling never
    after = rates.node_probs(tree)
    assert after[3] > before[3] and after[4] < before[4]


@pytest.mark.parametrize("pays", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["linear curve", "flat curve"])
def test_a_narrow_batch_stops_proposing_what_its_plan_would_cut(engine, default_model, bench_prompts, plain_runs, pays):
    """Under a curve where each node costs a token's pass (no draft can pay), once the plan over several
    rows chose width 1 the greedy rows propose nothing but every EXPLORE_EVERY-th step; under a flat
    curve they propose every step. The text is plain decoding's either way."""
    costs = CostModel((1, 64), (1.0, 1.0 if pays else 64.0))
    depths: list[list[int]] = []  # per row, the depth each of its steps allowed

    def watched(proposer):
        inner, seen = proposer.propose, []
        depths.append(seen)
        proposer.propose = lambda ctx: seen.append(ctx.max_depth) or inner(ctx)
        return proposer

    names = ("translation", "math_reasoning", "qa")  # short prompts: the depths asked are what is checked
    configs = [GenerationConfig(max_new_tokens=32) for _ in names]
    proposers = [watched(parse_method("pld").build(default_model)) for _ in configs]
    batched = generate_batch(engine, [bench_prompts[n] for n in names], proposers, configs, costs=costs, max_batch=3)
    assert [out.token_ids for out in batched] == [plain_runs.tokens(n, 32) for n in names]
    for seen in depths:
        if pays:
            assert sum(d > 0 for d in seen) >= len(seen) - 1, seen  # the last step has one token left
        else:  # the first rows' steps before the batch filled, then one step in EXPLORE_EVERY
            assert sum(d > 0 for d in seen) <= len(seen) // EXPLORE_EVERY + 4, seen


def test_one_call_api_takes_a_list_of_prompts(default_model):
    import specdec

    prompts = ["The capital of France is", [{"role": "user", "content": "Count to three."}]]
    many = specdec.generate(default_model, prompts, "pld", max_new_tokens=6, chat=True)
    alone = [specdec.generate(default_model, p, "pld", max_new_tokens=6, chat=True) for p in prompts]
    assert [o.token_ids for o in many] == [o.token_ids for o in alone]
    with pytest.raises(ValueError, match="empty"):
        specdec.generate(default_model, [], "pld")


def test_one_call_api_asks_for_a_loaded_model_not_a_name():
    import specdec

    with pytest.raises(TypeError, match=r"specdec.load_model\(NAME_OR_PATH\).*got str 'smollm2-135m'"):
        specdec.generate("smollm2-135m", "hi")


def test_generate_batch_file_writes_one_line_per_request_in_order(default_model, tmp_path, capsys):
    import json

    from specdec.cli import main

    lines = [{"prompt": "def add(a, b):", "max_new_tokens": 3}, {"messages": [{"role": "user", "content": "Hi"}]}]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    code = main(["generate", "--batch", str(path), "--dtype", "fp32", "--max-new-tokens", "5", "--method", "pld"])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [o["index"] for o in out] == [0, 1]
    assert len(out[0]["token_ids"]) == 3 and len(out[1]["token_ids"]) <= 5
    config = GenerationConfig(max_new_tokens=3)
    prompt_ids = encode_prompt(default_model.tokenizer, "def add(a, b):")
    assert out[0]["token_ids"] == engine_alone(default_model, prompt_ids, config)


def engine_alone(default_model, prompt_ids, config):
    from specdec.engine.loop import Engine

    return Engine(default_model).generate(prompt_ids, parse_method("pld").build(default_model), config).token_ids


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"promt": "x"}', "unknown keys"),
        ('{"prompt": "x", "messages": []}', "exactly one"),
        ('{"prompt": "  "}', "empty"),
        ("not json", "Expecting value"),
        ('{"prompt": "x", "temperature": -1}', "temperature"),
        ("", "no requests"),
    ],
)
def test_bad_batch_files_name_the_line(tmp_path, text, message):
    from specdec.jobs import read_requests

    path = tmp_path / "bad.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=message):
        read_requests(path, GenerationConfig(), chat=False)

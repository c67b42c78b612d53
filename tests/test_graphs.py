"""The bucketed static pass that a GPU replays as CUDA graphs (`specdec.backends.torch.graphs`).

CI has no GPU, so these tests run the same padded pass eagerly on the CPU: a tree
padded to its bucket (and rows padded to theirs) gives every real node the
logits of the unpadded pass, its padding never reaches the rows' committed
entries, and every method's greedy text through it equals plain decoding's.
The capture itself runs only on a GPU (benchmarks/gpu_check.sh).
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_logits_close, random_tree, tiny_llama

from specdec.backends.registry import verify_model
from specdec.backends.torch.draft_runner import GraphedSequence
from specdec.backends.torch.graphs import (
    MAX_NODES,
    GraphedPass,
    GraphedTarget,
    bucket,
    capacity_mask,
    graph_attention,
    padded_ancestry,
)
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.proposers import parse_method
from specdec.tree import DraftTree

PROMPTS = ([3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82], list(range(5, 240)))  # the last nears the cache's 256


def test_buckets_are_the_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 100, 128)] == [1, 2, 4, 8, 8, 16, 128, 128]
    assert GraphedPass.fits(3, MAX_NODES) and not GraphedPass.fits(3, MAX_NODES + 1)
    with pytest.raises(ValueError):
        bucket(0)


def test_without_cuda_the_pass_runs_eagerly_and_says_so():
    target = GraphedTarget(tiny_llama())
    assert target.graphed.mode == "eager"
    with pytest.raises(ValueError, match="CUDA"):
        GraphedPass(target, use_graphs=True)


def test_a_captured_pass_keeps_its_own_inputs():
    """A graph replays on its own input buffers, each replay copying the caller's inputs into them: an input
    already on the device (a draft's token picked there) must not become the graph's buffer, or the next
    replay would overwrite the caller's tensor (`BatchedTarget.verify_token`)."""
    rows = GraphedSequence(tiny_llama(), use_graphs=False).rows
    rows.add([3, 14, 15])
    token = torch.tensor([[7]])
    inputs = dict(tokens=token, positions=torch.tensor([[3]]), ancestry=torch.ones(1, 1, 1, dtype=torch.bool),
                  starts=torch.tensor([3]))
    rows.layout.starts, rows.layout.context = inputs["starts"], 3
    with torch.inference_mode():
        graph = rows.graphed._capture(inputs, rows.cache, rows.layout, ())
        graph.inputs["tokens"].fill_(9)  # what a replay's copy into the graph's buffer does
    assert all(graph.inputs[name] is not tensor for name, tensor in inputs.items())
    assert int(token) == 7


def _entries(rows: BatchedTarget, row: int) -> torch.Tensor:
    """Row `row`'s committed keys and values of every layer, stacked."""
    length = rows.lengths[row]
    return torch.stack([torch.cat([layer._keys[row, :, :length], layer._values[row, :, :length]])
                        for layer in rows.cache.layers])


def test_graphs_run_eager_attention_in_fp32_and_sdpa_in_half_precision():
    assert graph_attention(torch.float32) == "eager"
    assert graph_attention(torch.bfloat16) == graph_attention(torch.float16) == "sdpa"
    assert GraphedTarget(tiny_llama()).graphed.attention == "eager"  # tiny_llama is fp32
    assert GraphedTarget(tiny_llama(), attention="sdpa").graphed.attention == "sdpa"


def test_the_mask_made_in_the_graph_is_the_host_built_one():
    """`capacity_mask` (made from the trees' ancestry inside a graph) equals the additive mask the host
    builds for the same padded rows over the same capacity: committed slots, own lines, padding sees itself,
    and nothing past a row's tree."""
    rows = BatchedTarget(TargetModel(tiny_llama()))
    trees = [random_tree(n, 512, seed=n) for n in (5, 1, 13)] + [DraftTree.chain(0)]  # a padded row last
    width, keys, starts = 16, 64, [7, 0, 40, 0]
    want = rows._mask(trees, width, keys, starts)
    got = capacity_mask(padded_ancestry(trees, width), torch.tensor(starts), torch.arange(keys), torch.float32)
    assert got.shape == want.shape == (4, 1, width, keys)
    assert torch.equal(got, want)
    assert not torch.equal(got, rows._mask(trees, width, keys, [7, 0, 41, 0]))  # a row's start matters


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_padded_rows_and_nodes_give_the_unpadded_logits_and_cache(attention):
    """Three rows (padded to four) with trees of 5, 3 and 7 nodes (padded to 8), then chains, over
    several steps and the cache's growth: the same logits and committed entries as the ordinary pass,
    on either attention implementation a graph may run."""
    model = tiny_llama()
    plain = BatchedTarget(TargetModel(model))
    graphed_target = GraphedTarget(model, attention=attention)
    padded = BatchedTarget(graphed_target, graphed=graphed_target.graphed)
    for prompt in PROMPTS:
        for rows in (plain, padded):
            rows.add(prompt)
    for step in range(12):
        sizes = (5, 3, 7) if step % 2 else (1, 40, 2)
        trees = [random_tree(n, 512, seed=10 * step + b) for b, n in enumerate(sizes)]
        expected = plain.verify_trees(trees)
        actual = padded.verify_trees(trees)
        for (want, _), (got, _), tree in zip(expected, actual, trees, strict=True):
            assert got.shape == (tree.num_nodes, 512)
            assert_logits_close(got, want)
        paths = [tree.ancestor_lines[-1] for tree in trees]  # the last node's root-to-node path
        for rows in (plain, padded):
            rows.commit(paths)
        assert padded.lengths == plain.lengths
        for b in range(len(PROMPTS)):
            assert_logits_close(_entries(padded, b), _entries(plain, b))
    assert max(padded.lengths) > 256  # the cache grew past its first capacity on the way


@pytest.mark.parametrize(
    "method", [pytest.param("plain", marks=pytest.mark.slow), pytest.param("pld", marks=pytest.mark.slow), "logitspec"]
)  # the fast tier: LogitSpec's trees, padded; the full tier plain and pld too
def test_greedy_text_through_the_padded_pass_equals_plain(default_model, engine, method):
    """The engine on the padded pass (what a GPU replays) emits plain decoding's tokens (fp32)."""
    prompt = default_model.tokenizer("Count from one to twelve: one, two, three,").input_ids
    config = GenerationConfig(max_new_tokens=24)
    want = engine.generate(prompt, parse_method("plain").build(default_model), config).token_ids
    padded = Engine(default_model)
    padded.target = GraphedTarget(verify_model(default_model))
    got = padded.generate(prompt, parse_method(method).build(default_model), config)
    assert got.token_ids == want
    assert method == "plain" or got.stats.num_decode_steps < len(want)  # drafts were accepted


@pytest.mark.slow
@pytest.mark.parametrize(("inductor", "mode"), [("dynamic", "eager+inductor"), ("static", "eager+inductor-static")])
def test_the_inductor_pass_gives_the_padded_pass_logits(inductor, mode):
    """The "compiled" backend's GPU pass, compiled by inductor with dynamic sizes or once a bucket (on the
    CPU here, so without graphs): trees of several buckets and one or two rows give the ordinary pass's
    logits up to the fused loops' summation order. Compiling takes ~25 s on 2 cores."""
    model = tiny_llama()
    plain = BatchedTarget(TargetModel(model))
    target = GraphedTarget(model, inductor=inductor)
    fused = BatchedTarget(target, graphed=target.graphed)
    assert target.graphed.mode == mode
    for prompt in PROMPTS[:2]:
        for rows in (plain, fused):
            rows.add(prompt)
    for step, sizes in enumerate(((1, 1), (5, 3), (12, 2), (2, 7))):
        trees = [random_tree(n, 512, seed=10 * step + b) for b, n in enumerate(sizes)]
        for (want, _), (got, _) in zip(plain.verify_trees(trees), fused.verify_trees(trees), strict=True):
            assert_logits_close(got, want)
        paths = [tree.ancestor_lines[-1] for tree in trees]
        for rows in (plain, fused):
            rows.commit(paths)
    assert target.graphed.compile_failure is None and target.graphed.mode == mode


def test_an_unknown_inductor_mode_is_refused():
    with pytest.raises(ValueError, match="inductor must be one of"):
        GraphedTarget(tiny_llama(), inductor="fast")

"""Batch-invariant verification (specdec.backends.torch.invariant): bf16 output that does not depend on the pass.

On a CPU whose oneDNN runs bf16 (where `exact="on"` can turn invariance on), checks
that a tree node's logits and features carry the bits of one-token passes along
its path (trees, batches of rows, contexts across 1,024 keys); that a prompt
prefilled in chunks has the bits of one prefilled whole; and that every method's
greedy output equals plain decoding's in bf16: a few in the fast tier, the matrix
over two prompts per category, one proposer serving them in turn (its history
carried), eight rows in one batch and seeded sampling in the full tier. The same
node check run with `exact=off` must find differences here, so it can fail.
Skipped where oneDNN has no bf16 (invariance is off there; fp32 is the reference).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers import build_proposer, prompts_by_category

from specdec.backends.contract import PromptFill
from specdec.backends.torch.invariant import TAIL, Layout, verifiable
from specdec.backends.torch.packed import can_pack, is_invariant
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine, generate_batch
from specdec.models import load_model
from specdec.proposers import parse_method
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

pytestmark = pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="no oneDNN bf16 here")

FAST_METHODS = ("pld", "logitspec", "eagle")
METHODS = (
    "pld", "logitspec", "logitspec:adaptive=false,budget=64", "logitspec:session=true,recycle=true", "recycle",
    "lookahead", "session", "eagle", "eagle:retrieval=true", "eagle:adaptive=false,budget=24,topk=4", "medusa",
)  # fmt: skip


@pytest.fixture(scope="module")
def bf16() -> dict:
    """The default model in bf16, loaded twice: invariant (exact=on) and not (exact=off, the default)."""
    loaded = {exact: load_model("smollm2-135m", dtype="bf16", exact=exact) for exact in ("on", "off")}
    assert is_invariant(loaded["on"]) and not is_invariant(loaded["off"])
    # exact=off on SDPA: no attention plan to time (the invariant engine ignores the choice)
    return {exact: (model, Engine(model, attention="sdpa")) for exact, model in loaded.items()}


@pytest.fixture(scope="module")
def text_ids(bf16) -> list[int]:
    loaded, _ = bf16["on"]
    text = " ".join(f"Step {i}: the value of x{i} is {i * 7 % 13}, so we carry it to line {i + 1}." for i in range(200))
    return loaded.tokenizer(text).input_ids


def _random_tree(root: int, size: int, generator: torch.Generator) -> DraftTree:
    """A tree of `size` nodes, each below one of the three nodes before it (branches at every depth)."""
    parents = [-1] + [int(torch.randint(max(0, i - 3), i, (1,), generator=generator)) for i in range(1, size)]
    tokens = [root] + torch.randint(0, 49152, (size - 1,), generator=generator).tolist()
    return DraftTree(torch.tensor(tokens), torch.tensor(parents))


@torch.inference_mode()
def _node_mismatches(engine: Engine, ids: list[int], starts: list[int], sizes: list[int]) -> int:
    """Nodes of one batched pass (row b: a random tree below ids[:starts[b]]) whose logits or captured
    features differ from one-token passes of the target along the node's path."""
    generator = torch.Generator().manual_seed(sum(starts))
    batch = BatchedTarget(engine.target)
    batch.capture = (2, 15)  # features as an EAGLE head reads them, from the same pass
    for start in starts:
        batch.add(ids[:start])
    trees = [_random_tree(ids[s], n, generator) for s, n in zip(starts, sizes, strict=True)]
    results = batch.verify_trees(trees)
    reference = TargetModel(engine.target.model, attention=engine.target.attention)
    mismatches = 0
    for (logits, features), start, tree in zip(results, starts, trees, strict=True):
        reference.prefill(ids[:start])
        for node in range(tree.num_nodes):
            for depth, index in enumerate(tree.path(node)):  # one token a pass, as plain decoding runs
                ref_logits, ref_features = reference.run(
                    tree.tokens[index : index + 1][None], None, None, reference.cache, start + depth,
                    capture=batch.capture,
                )
            reference.trim(start)  # the passes above appended to the cache; drop them
            same = torch.equal(ref_logits[0, 0], logits[node]) and torch.equal(ref_features[0, 0], features[node])
            mismatches += not same
    return mismatches


# contexts below and across 1,024 keys; three rows of different lengths in one pass
CONTEXTS = [([40], [12]), ([300, 90, 1030], [16, 5, 9])]


@pytest.mark.parametrize("starts,sizes", CONTEXTS)
def test_tree_nodes_carry_one_token_bits(bf16, text_ids, starts, sizes):
    _, engine = bf16["on"]
    assert _node_mismatches(engine, text_ids, starts, sizes) == 0


@pytest.mark.slow
def test_without_invariance_the_node_check_fails_here(bf16, text_ids):
    """The control (the check has teeth), in the full tier: transformers' bf16 modules, ~11 s here."""
    _, engine = bf16["off"]
    starts, sizes = CONTEXTS[1]
    assert _node_mismatches(engine, text_ids, starts, sizes) > 0


@pytest.fixture(scope="module")
def whole_prompt(bf16, text_ids) -> tuple[list[int], TargetModel, torch.Tensor]:
    """A prompt past 1,024 keys (both of oneDNN's summation regimes), prefilled whole: its target and last logits."""
    _, engine = bf16["on"]
    prompt = text_ids[:1300]
    whole = TargetModel(engine.target.model, attention=engine.target.attention)
    return prompt, whole, whole.prefill(prompt)


@pytest.mark.parametrize("chunk", [256, pytest.param(100, marks=pytest.mark.slow), pytest.param(1300, marks=pytest.mark.slow)])
def test_a_prompt_prefilled_in_chunks_has_the_bits_of_the_whole(bf16, whole_prompt, chunk):
    _, engine = bf16["on"]
    prompt, whole, last = whole_prompt
    batch = BatchedTarget(engine.target)
    fill = PromptFill(prompt)
    joined = None
    while joined is None:
        joined = batch.fill(fill, chunk)
    assert torch.equal(joined[1], last)
    for mine, theirs in zip(batch.cache.layers, whole.cache.layers, strict=True):
        assert torch.equal(mine._keys[0, :, : len(prompt)], theirs.keys[0])


def test_a_branch_deeper_than_the_tail_is_cut_before_verification(bf16, text_ids):
    """A node whose first non-ancestor lies more than TAIL - 1 positions back cannot be read invariantly by
    the PyTorch attention: a bare pass refuses it, and the engine cuts it (and what hangs below it) from the
    tree first. The fused pass reads each node's key sequence whole, so there the deep node gets the bits of
    the same tokens verified as a chain."""
    _, engine = bf16["on"]
    depth = TAIL + 2
    tokens = torch.tensor(text_ids[50 : 50 + depth + 1])
    parents = torch.tensor([-1, 0, 0, *range(2, depth)])  # node 1 a sibling; the chain below node 2 goes deep
    tree = DraftTree(tokens, parents)
    allowed = torch.zeros(1, tree.num_nodes, 50 + tree.num_nodes, dtype=torch.bool)
    allowed[0, :, :50] = True
    allowed[0, :, 50:] = tree.ancestor_mask
    with pytest.raises(ValueError, match="branch too deep"):  # the PyTorch attention's layout, on any machine
        Layout.of(allowed, torch.bfloat16)
    target = TargetModel(engine.target.model, attention=engine.target.attention)
    target.prefill(text_ids[:50])
    if target.runs_fused:
        deep = target.forward_tree(tokens, parents)[-1].clone()
        target.trim(50)
        chain = torch.cat([tokens[:1], tokens[2:]])
        assert torch.equal(deep, target.forward_tree(chain, torch.arange(-1, len(chain) - 1))[-1])
    else:
        with pytest.raises(ValueError, match="branch too deep"):
            target.forward_tree(tokens, parents)
    cut = verifiable(tree)
    assert cut.max_depth == TAIL and cut.num_nodes == TAIL + 2
    target.trim(50)
    assert target.forward_tree(cut.tokens, cut.parents).shape[0] == cut.num_nodes
    assert verifiable(DraftTree.chain(1, list(range(3 * TAIL)))).num_nodes == 3 * TAIL + 1  # chains: any depth


@pytest.fixture(scope="module")
def prompts(bf16, spec_bench_subset) -> dict[str, list[int]]:
    loaded, _ = bf16["on"]
    return prompts_by_category(loaded.tokenizer, spec_bench_subset)


@pytest.fixture(scope="module")
def plain(bf16) -> Callable[[list[int], GenerationConfig], list[int]]:
    """Plain decoding's tokens on the invariant engine per (prompt, settings), each computed once: every
    method in this module is compared with the same output (the pass is deterministic)."""
    loaded, engine = bf16["on"]
    outputs: dict[tuple, list[int]] = {}

    def tokens(prompt: list[int], config: GenerationConfig) -> list[int]:
        key = (tuple(prompt), config)
        if key not in outputs:
            outputs[key] = engine.generate(prompt, parse_method("plain").build(loaded), config).token_ids
        return outputs[key]

    return tokens


@pytest.mark.parametrize("method", FAST_METHODS)
def test_greedy_bf16_output_is_plain_decoding(bf16, plain, prompts, method):
    loaded, engine = bf16["on"]
    config = GenerationConfig(max_new_tokens=40)
    proposer = parse_method(method).build(loaded)
    for name in ("summarization-1", "math_reasoning-1"):
        prompt = next(ids for key, ids in prompts.items() if key.startswith(name.split("-")[0]))
        out = engine.generate(prompt, proposer, config)
        assert out.token_ids == plain(prompt, config), (method, name)


# Methods whose drafts come from state earlier requests leave (recycle tables, session stores).
LEARNS = {"logitspec", "logitspec:session=true,recycle=true", "recycle", "session"}


@pytest.mark.slow
@pytest.mark.parametrize("method", (*METHODS, "datastore", "layerskip", "draft:self"))
def test_every_method_greedy_bf16_equals_plain_after_a_history(bf16, plain, method, spec_bench_subset, request):
    """One proposer serves a prompt of each category in turn, 48 tokens each: what it adapts carries over.
    Methods that draft from what earlier requests taught them (`LEARNS`) serve both prompts of each category,
    so the second meets text the first left behind."""
    loaded, engine = bf16["on"]
    from specdec.data import load_questions
    from specdec.prompts import encode_prompt

    config = GenerationConfig(max_new_tokens=48)
    proposer = build_proposer(loaded, method, request)
    questions, seen = [], set()
    for question in load_questions(spec_bench_subset):
        if method in LEARNS or question.category not in seen:
            questions.append(question)
        seen.add(question.category)
    drafted = 0
    for question in questions:
        prompt = encode_prompt(loaded.tokenizer, question.turns[0], chat=True)
        out = engine.generate(prompt, proposer, config)
        assert out.token_ids == plain(prompt, config), (method, question.question_id)
        drafted += sum(step.num_accepted for step in out.stats.steps)
    assert drafted > 0, method


@pytest.mark.slow
def test_eight_rows_in_one_batch_equal_their_prompts_alone(bf16, plain, prompts):
    loaded, engine = bf16["on"]
    config = GenerationConfig(max_new_tokens=40)
    chosen = list(prompts.values()) + list(prompts.values())[:2]  # 8 rows, two prompts twice
    methods = ["logitspec", "eagle", "pld", "recycle"] * 2
    outs = generate_batch(engine, chosen, [parse_method(m).build(loaded) for m in methods], config, max_batch=8)
    for prompt, out, method in zip(chosen, outs, methods, strict=True):
        assert out.token_ids == plain(prompt, config), method


@pytest.mark.slow
@pytest.mark.parametrize("method", ("pld", "logitspec", "eagle:sampled=false"))
def test_seeded_sampling_in_bf16_equals_plain_sampling(bf16, plain, prompts, method):
    """Drafts without probabilities: the engine draws the t-th token with the t-th uniform, so a seeded
    sampled request is plain sampling's very tokens when the logits carry the same bits."""
    loaded, engine = bf16["on"]
    config = GenerationConfig(max_new_tokens=32, sampling=SamplingParams(temperature=0.8, seed=5))
    for prompt in list(prompts.values())[:3]:
        out = engine.generate(prompt, parse_method(method).build(loaded), config)
        assert out.token_ids == plain(prompt, config), method


@pytest.mark.slow
def test_seeded_drawn_trees_alone_and_batched_draw_the_same_tokens(bf16, prompts):
    """`eagle:sampled=true` draws its trees: a seeded row gives the same tokens alone and in a batch of two
    (the batch never cuts a drawn tree, and the invariant pass gives both the same logits)."""
    from helpers import save_fixed_costs

    from specdec.engine.costs import load_or_measure

    loaded, engine = bf16["on"]
    costs = load_or_measure(save_fixed_costs(loaded))  # fixed: no timing in tests
    chosen = list(prompts.values())[:2]
    configs = [GenerationConfig(max_new_tokens=32, sampling=SamplingParams(temperature=0.9, seed=s), ignore_eos=True)
               for s in (1, 2)]  # fmt: skip
    method = parse_method("eagle:sampled=true")
    solo = [engine.generate(p, method.build(loaded), c) for p, c in zip(chosen, configs, strict=True)]
    batched = generate_batch(engine, chosen, lambda: method.build(loaded), configs, costs=costs, max_batch=2)
    assert [o.token_ids for o in solo] == [o.token_ids for o in batched]
    assert all(len(o.token_ids) == 32 for o in batched)

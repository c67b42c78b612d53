"""The exact int4 pass with its decoder layers in C++ (specdec.backends.torch.fused): which models run it,
that it computes what transformers' layers compute on the same 4-bit weights, and that a row's bits do not
depend on the pass around it (tree nodes, batched rows and prompt chunks against one-token passes)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import save_fixed_costs, tiny_llama, tiny_qwen2
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.backends.registry import timing_target, verifier
from specdec.backends.torch.attention_plan import AttentionPlan
from specdec.backends.torch.fused import FusedDecoder, KeySequences, _causal_rows, why_not
from specdec.backends.torch.invariant import kernel_runs_here
from specdec.backends.torch.packed import pack_of, packed_view
from specdec.backends.torch.rows import BatchedTarget, OneSequence
from specdec.backends.torch.target import TargetModel
from specdec.kernels import q4_kernel
from specdec.models import load_model
from specdec.tree import DraftTree

needs_kernel = pytest.mark.skipif(
    not (q4_kernel.load_extension() and kernel_runs_here()),
    reason="the fused pass needs specdec's extension and a CPU with AVX-512 BF16",
)


def tiny_qwen2_64() -> torch.nn.Module:
    """A bf16 Qwen2 (q, k and v with biases, random ones: a bias read wrongly must show) with heads of 64."""
    model = tiny_qwen2(heads_of_64=True).to(torch.bfloat16)
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_(0, 0.5)
    return model


def test_only_models_it_can_run_get_the_fused_pass():
    assert "not bf16" in why_not(tiny_llama())
    assert why_not(torch.nn.Linear(4, 4)) == "not a transformers causal LM"
    if not q4_kernel.load_extension() or not kernel_runs_here():
        assert "tree-attention kernel" in why_not(packed_view(tiny_qwen2_64(), int4=True))
        return
    assert "heads of 16" in why_not(packed_view(tiny_llama().to(torch.bfloat16), int4=True))
    assert "4-bit kernel" in why_not(packed_view(tiny_qwen2_64()))  # packed bf16, not int4
    assert why_not(packed_view(tiny_qwen2_64(), int4=True)) is None
    with pytest.raises(ValueError, match="the fused pass cannot run this model: the model is not bf16"):
        FusedDecoder(tiny_llama())


def _logits(target: TargetModel, prompt: torch.Tensor) -> torch.Tensor:
    """Every position's logits [T, V] of `prompt` in one pass on a fresh cache."""
    target.reset()
    return target.append(prompt).float()


def tiny_llama_128() -> torch.nn.Module:
    """A bf16 Llama with two query heads and one key head of 128 (the attention kernel's other size)."""
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=128, max_position_embeddings=512)
    torch.manual_seed(2)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


@needs_kernel
@pytest.mark.parametrize("make", [tiny_qwen2_64, tiny_llama_128], ids=["qwen2 heads of 64", "llama heads of 128"])
def test_fused_layers_compute_what_transformers_layers_compute(make):
    """Same weights, same kernels: the fused pass and transformers' modules on the int4 view differ only by
    the order of a few fp32 sums and SiLU's exp, so their logits agree to bf16's rounding (a wrong rotary
    half, a lost bias or a skipped norm moves them by far more)."""
    view = packed_view(make(), int4=True)
    plan = AttentionPlan.invariant()
    fused, unfused = TargetModel(view, attention=plan), TargetModel(view, attention=plan)
    unfused._fused = None
    assert fused._fused is not None
    prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1))
    ours, theirs = _logits(fused, prompt), _logits(unfused, prompt)
    scale = theirs.abs().max()
    assert (ours - theirs).abs().max() <= 0.02 * scale
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95


@needs_kernel
def test_a_pass_takes_its_inputs_in_one_call_as_the_modules_give_them():
    """`pass_inputs` (the embedding and rotary rows of a pass in one C++ call) against the embedding module and
    the tables read in Python, rows past the tables' first block and a batch of trees' positions included;
    a token or a position outside its table is refused."""
    fused = FusedDecoder(packed_view(tiny_qwen2_64(), int4=True))
    assert fused.direct
    data = torch.Generator().manual_seed(4)
    ids = torch.randint(0, fused.embed.num_embeddings, (3, 7), generator=data)
    positions = torch.randint(0, 600, (3, 7), generator=data)
    fused._grow(600)
    hidden, cos, sin = torch.ops.specdec_layer.pass_inputs(ids, fused.embed.weight, positions, fused._cos, fused._sin)
    expected = fused.embed(ids)
    assert torch.equal(hidden, expected)
    assert all(torch.equal(a, b) for a, b in zip((cos, sin), fused.angles(expected, positions), strict=True))
    rotary = fused.rotary(expected, positions)  # the module itself, for these positions at once
    assert torch.equal(cos, rotary[0]) and torch.equal(sin, rotary[1])
    with pytest.raises(RuntimeError, match="outside the embedding"):
        torch.ops.specdec_layer.pass_inputs(ids + 10**6, fused.embed.weight, positions, fused._cos, fused._sin)
    with pytest.raises(RuntimeError, match="outside the tables"):
        torch.ops.specdec_layer.pass_inputs(ids, fused.embed.weight, positions + 10**6, fused._cos, fused._sin)


@needs_kernel
@pytest.mark.parametrize("activations", ["int8", "bf16"])
def test_gate_and_up_joined_give_the_two_products_bits(activations):
    """The fused layer runs gate and up as one product (15 weights); the same layer with them apart (18)
    gives the same bits, and the layers' own blocks are views of the joined ones."""
    view = packed_view(tiny_qwen2_64(), int4=True)
    for layer in view.model.layers:  # the form under test (int8 where the CPU has VNNI, else bf16 only)
        if activations == "int8" and q4_kernel.default_activations() != "int8":
            pytest.skip("the 8-bit form runs on CPUs with AVX-512 VNNI")
        for name in ("gate_proj", "up_proj", "down_proj"):
            old = getattr(layer.mlp, name)
            setattr(layer.mlp, name, q4_kernel.Q4Linear(*old.blocks(), old.bias, activations))
    fused = FusedDecoder(view)
    mlp = view.model.layers[0].mlp
    weights = fused.layers[0]
    assert len(weights) == 15 and mlp.gate_proj.qs.data_ptr() == weights[9].data_ptr()
    again = FusedDecoder(view).layers[0]  # a second target over the same model joins nothing again
    assert all(a is b for a, b in zip(again[9:12], weights[9:12], strict=True))
    apart = [*weights[:9], *(t for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj) for t in (p.qs, p.scale, p.minimum))]
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, 5, view.config.hidden_size, generator=generator).to(torch.bfloat16)
    heads, kv_heads, dim = fused.heads, fused.kv_heads, fused.dim
    cos, sin = (part.contiguous() for part in fused.rotary(hidden, torch.arange(5)[None]))
    outs = []
    for w in (weights, apart):
        keys, values = (torch.zeros(1, kv_heads, 16, dim, dtype=torch.bfloat16) for _ in range(2))
        outs.append(torch.ops.specdec_layer.decoder_layer(
            hidden, w, cos, sin, keys, values, torch.tensor([0]), torch.arange(1, 6)[None],
            torch.zeros(1, 5, 0, dtype=torch.int64), torch.zeros(1, 5, dtype=torch.int64), heads, kv_heads,
            fused.eps, fused.scale, 1))
    assert torch.equal(outs[0], outs[1])


@pytest.fixture(scope="module")
def exact_int4():
    if not (q4_kernel.load_extension() and kernel_runs_here()):
        pytest.skip("the fused pass needs specdec's extension and a CPU with AVX-512 BF16")
    return save_fixed_costs(load_model("smollm2-135m", dtype="bf16", pack="int4", exact="on"))


def _singles(target: TargetModel, first: int, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy one-token passes from `first`: the tokens fed and each pass's logits (committed)."""
    tokens, logits = [first], []
    for _ in range(steps):
        out = target.forward_tree(torch.tensor([tokens[-1]]), torch.tensor([-1]))[0].clone()
        target.commit([0])
        logits.append(out)
        tokens.append(int(out.argmax()))
    return tokens, logits


def test_the_engine_and_its_cost_curve_run_the_fused_pass(exact_int4):
    assert verifier(exact_int4)._fused is not None
    timed = timing_target(exact_int4)  # the trees are sized by the pass the engine runs, through a row of its own
    assert isinstance(timed, OneSequence) and timed.rows.single._fused is not None
    timed.close()


def test_rows_get_the_bits_of_one_token_passes(exact_int4, bench_prompts):
    """A tree's nodes, a batched row and a prompt prefilled in chunks: each row's logits equal, bit for bit,
    those of one-token passes at its place."""
    target = verifier(exact_int4)
    prompt = torch.tensor(bench_prompts["summarization"][:120])
    assert len(prompt) == 120
    first = int(target.prefill(prompt).argmax())
    tokens, singles = _singles(target, first, 4)
    target.trim(len(prompt))
    # the path t0 t1 t2 t3 with siblings beside it: nodes 0, 1, 3, 4 are the path
    tree = DraftTree(torch.tensor([tokens[0], tokens[1], 5, tokens[2], tokens[3], 7]), torch.tensor([-1, 0, 0, 1, 3, 1]))
    logits = target.forward_tree(tree.tokens, tree.parents)
    for step, node in enumerate((0, 1, 3, 4)):
        assert torch.equal(logits[node], singles[step]), node
    target.trim(len(prompt))
    # the same prompt prefilled in two chunks (the cache then continues as a whole prefill's would)
    target.reset()
    target.append(prompt[:50])
    assert torch.equal(target.append(prompt[50:])[-1], target.prefill(prompt))
    # two batched rows, one of them this prompt, stepping its tokens
    rows = BatchedTarget(target)
    other = torch.tensor(bench_prompts["math_reasoning"][:60])
    for ids in (prompt, other):
        rows.add(ids)
    for step in range(3):
        trees = [DraftTree(torch.tensor([tokens[step]]), torch.tensor([-1])), DraftTree(torch.tensor([11]), torch.tensor([-1]))]
        assert torch.equal(rows.verify_trees(trees)[0][0][0], singles[step]), step
        rows.commit([[0], [0]])


def test_key_sequences_are_each_nodes_prefix_then_its_ancestors():
    """A tree pass's rows read the committed prefix, then their ancestors and themselves in position order;
    a padding row reads the prefix and its own slot (what `BatchedTarget`'s mask lets it see)."""
    tree = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 0, 2]))
    keys = KeySequences.of_trees([tree, DraftTree.chain(9)], [10, 4], 5)
    assert keys.starts.tolist() == [[10] * 5, [4] * 5]
    assert keys.counts.tolist() == [[1, 2, 2, 3, 1], [1, 1, 1, 1, 1]]
    tail = keys.tail_slots.view(2, 5, 3).tolist()
    assert tail[0] == [[10, 0, 0], [10, 11, 0], [10, 12, 0], [10, 12, 13], [14, 0, 0]]
    assert tail[1] == [[4, 0, 0], [5, 0, 0], [6, 0, 0], [7, 0, 0], [8, 0, 0]]


def test_a_causal_pass_reads_every_slot_up_to_its_own_position():
    """Row t of a causal pass after `context` tokens sits at context + t and reads slots [0, context + t], nothing
    gathered; the C++ pass takes them as contiguous int64 tensors."""
    positions, starts, counts, tail = _causal_rows(2, 3, 5)
    assert positions.tolist() == [[5, 6, 7]] * 2
    assert starts.tolist() == [[6, 7, 8]] * 2
    assert counts.tolist() == [[0, 0, 0]] * 2
    assert tail.shape == (2, 3, 0)
    assert all(t.dtype == torch.int64 and t.is_contiguous() for t in (positions, starts, counts, tail))


def test_batched_trees_of_different_sizes_get_each_trees_bits_alone(exact_int4, bench_prompts):
    """Rows padded to the widest tree of the pass: each row's nodes get the logits its tree gets alone."""
    target = verifier(exact_int4)
    prompts = [torch.tensor(bench_prompts["summarization"][:90]), torch.tensor(bench_prompts["math_reasoning"][:70])]
    trees = [DraftTree(torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([-1, 0, 0, 1, 3, 2])),
             DraftTree(torch.tensor([11, 12, 13]), torch.tensor([-1, 0, 0]))]
    alone = []
    for ids, tree in zip(prompts, trees, strict=True):
        target.prefill(ids)
        alone.append(target.forward_tree(tree.tokens, tree.parents).clone())
        target.trim(len(ids))
    rows = BatchedTarget(target)
    for ids in prompts:
        rows.add(ids)
    for (logits, _), expected in zip(rows.verify_trees(trees), alone, strict=True):
        assert torch.equal(logits, expected)
    rows.release()


def test_a_gguf_model_in_bf16_verifies_on_the_fused_pass_by_default(exact_int4):
    """`pack="auto"` settles on int4 for a GGUF source in bf16 where the fused pass runs (the bundled model's
    Q4_1 blocks come back group for group), and keeps bf16 packing for everything else."""
    loaded = load_model("smollm2-135m", dtype="bf16")
    assert loaded.pack == "auto" and pack_of(loaded) == "int4"
    assert verifier(loaded)._fused is not None
    assert pack_of(dataclasses.replace(loaded, exact="off")) == "auto"
    assert pack_of(dataclasses.replace(loaded, pack="on")) == "on"
    assert pack_of(dataclasses.replace(loaded, gguf_path=None)) == "auto"  # a folder or a model object
    assert pack_of(load_model("smollm2-135m", dtype="fp32")) == "auto"


@needs_kernel
def test_one_call_runs_every_layer_and_the_final_norm():
    """`decoder_pass` (every layer, then the final norm, in one C++ call) gives the bits of a captured pass,
    which runs the layers in stretches between its captures: the same logits whatever is captured, a state
    the same bits whichever other states are captured with it, each within bf16 rounding of the model's own
    hidden state there, and the captured last state the normed one the head reads."""
    view = packed_view(tiny_qwen2_64(), int4=True)
    target = TargetModel(view, attention=AttentionPlan.invariant())
    prompt = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(4))
    outs = {}
    for capture in ((), (1, -1), (0, 1, 2), (-1,)):
        target.reset()
        outs[capture] = target.run(prompt, None, None, target.cache, 0, capture=capture)
    whole, none = outs[()]
    assert none is None and all(torch.equal(logits, whole) for logits, _ in outs.values())
    size = view.config.hidden_size
    pair, three, last = outs[(1, -1)][1], outs[(0, 1, 2)][1], outs[(-1,)][1]
    assert torch.equal(pair[..., :size], three[..., size : 2 * size]) and torch.equal(pair[..., size:], last)
    assert torch.equal(target._fused.head(last), whole)
    with torch.no_grad():
        states = view(prompt, output_hidden_states=True).hidden_states
    for index in range(3):
        got = three[..., index * size : (index + 1) * size].float()
        assert torch.allclose(got, states[index].float(), atol=0.1, rtol=0.05), index


@needs_kernel
def test_rotary_angles_of_a_position_do_not_depend_on_the_pass():
    """The tables give a position the same angles alone or among others (across the blocks they grow
    by), within a bf16 rounding of the model's rotary module at that position."""
    fused = FusedDecoder(packed_view(tiny_qwen2_64(), int4=True))
    hidden = torch.zeros(1, 1, fused.dim, dtype=torch.bfloat16)
    together = torch.tensor([[3, 255, 256, 700]])
    cos, sin = fused.angles(hidden, together)
    for t, position in enumerate(together[0].tolist()):
        alone = fused.angles(hidden, torch.tensor([[position]]))
        assert torch.equal(alone[0][0, 0], cos[0, t]) and torch.equal(alone[1][0, 0], sin[0, t])
        module = fused.rotary(hidden, torch.tensor([[position]]))
        for ours, theirs in zip((cos[0, t], sin[0, t]), module, strict=True):
            assert torch.allclose(ours.float(), theirs[0, 0].float(), atol=1e-2, rtol=0)
    two_rows = fused.angles(hidden, torch.tensor([[3, 4], [700, 3]]))[0]
    assert torch.equal(two_rows[1, 1], cos[0, 0]) and torch.equal(two_rows[1, 0], cos[0, 3])


@needs_kernel
def test_one_call_refuses_a_wrong_final_norm_before_any_layer_writes():
    fused = FusedDecoder(packed_view(tiny_qwen2_64(), int4=True))
    hidden = torch.randn(1, 3, fused.norm_weight.numel()).to(torch.bfloat16)
    cos, sin = fused.angles(hidden, torch.arange(3)[None])
    caches = [torch.zeros(1, fused.kv_heads, 8, fused.dim, dtype=torch.bfloat16) for _ in fused.layers]
    writes = [torch.tensor([0]) for _ in fused.layers]
    with pytest.raises(RuntimeError, match="final norm"):
        torch.ops.specdec_layer.decoder_pass(
            hidden, fused.weights, cos, sin, caches, caches, writes, torch.arange(1, 4)[None],
            torch.zeros(1, 3, 0, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64), fused.heads,
            fused.kv_heads, fused.eps, fused.scale, fused.norm_weight[:-1].contiguous(), fused.norm_eps)
    assert all(not cache.any() for cache in caches)


@needs_kernel
def test_the_layers_method_is_the_op():
    """`Layers.run` (what a pass calls: no search of its arguments for fake script objects) is `decoder_pass`:
    the same bits out and the same keys and values written; and it refuses what the op refuses."""
    fused = FusedDecoder(packed_view(tiny_qwen2_64(), int4=True))
    hidden = torch.randn(1, 3, fused.norm_weight.numel(), generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    cos, sin = fused.angles(hidden, torch.arange(3)[None])
    layout = (torch.arange(1, 4)[None], torch.zeros(1, 3, 0, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64))
    writes = [torch.tensor([0, 1, 2]) for _ in fused.layers]
    outs = []
    for call in (torch.ops.specdec_layer.decoder_pass, lambda h, layers, *rest: layers.run(h, *rest)):
        keys = [torch.zeros(1, fused.kv_heads, 8, fused.dim, dtype=torch.bfloat16) for _ in fused.layers]
        values = [torch.zeros_like(k) for k in keys]
        out = call(hidden, fused.weights, cos, sin, keys, values, writes, *layout, fused.heads, fused.kv_heads,
                   fused.eps, fused.scale, fused.norm_weight, fused.norm_eps)
        outs.append((out, keys, values))
    (a, keys_a, values_a), (b, keys_b, values_b) = outs
    assert torch.equal(a, b) and keys_a[0].any()
    assert all(torch.equal(x, y) for x, y in zip(keys_a + values_a, keys_b + values_b, strict=True))
    with pytest.raises(RuntimeError, match="final norm"):
        fused.weights.run(hidden, cos, sin, keys_a, values_a, writes, *layout, fused.heads, fused.kv_heads,
                          fused.eps, fused.scale, fused.norm_weight[:-1].contiguous(), fused.norm_eps)


@needs_kernel
def test_the_weights_handed_over_must_match_their_layer_sizes():
    """The layers' weights pass to C++ once; a size list that does not cover them is refused there."""
    fused = FusedDecoder(packed_view(tiny_qwen2_64(), int4=True))
    weights = [t for layer in fused.layers for t in layer]
    with pytest.raises(RuntimeError, match="sizes summing"):
        torch.classes.specdec_layer.Layers(weights, [len(weights) - 1], [1])
    with pytest.raises(RuntimeError, match="one size and one qkv part count per layer"):
        torch.classes.specdec_layer.Layers(weights, [len(weights)], [1, 1])


# What must hold on every path: attention is softmax attention and a row's bits are its own (tree attention's
# tests), the layer computes transformers' layer; on the AVX2 path also the bundled model's tree rows against
# one-token passes (the scalar path runs the same source, minutes slower on the bundled model).
PORTABLE_CHECKS = ("tests/test_tree_attention.py", "tests/test_fused.py::test_fused_layers_compute_what_transformers_layers_compute")
BUNDLED_CHECKS = ("tests/test_fused.py::test_rows_get_the_bits_of_one_token_passes",
                  "tests/test_fused.py::test_batched_trees_of_different_sizes_get_each_trees_bits_alone")


@pytest.mark.slow
@pytest.mark.parametrize("cap", ["avx2", "scalar"])
def test_the_portable_paths_keep_every_rows_bits(cap):
    """The fused pass on CPUs without AVX-512 BF16: tree attention and the layer's steps on portable.cpp's code,
    the products on their AVX2 or scalar path (SPECDEC_KERNELS forces them here; it is read once a process, so
    the checks run in a process of their own)."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    if cap not in torch.ops.specdec_q4.q4_linear_i8_paths():
        pytest.skip(f"this CPU has no {cap} path")
    root = Path(__file__).resolve().parent.parent
    checks = [*PORTABLE_CHECKS, *(BUNDLED_CHECKS if cap == "avx2" else ())]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *checks],
                         cwd=root, env={**os.environ, "SPECDEC_KERNELS": cap}, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]

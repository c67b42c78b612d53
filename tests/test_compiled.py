"""The compiled verification pass (`backend="compiled"`, `specdec.backends.compiled`).

Compiling costs a minute or two per graph on a 2-core CPU (cached on disk after),
so everything that compiles is in the full tier. Lossless means: on this backend
every method's greedy text equals plain decoding's on the same backend; in fp32
it also equals the eager backend's.
"""

import dataclasses
import warnings

import pytest
import torch
from helpers import TEXTS, save_fixed_costs
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.backends.compiled import CompiledTarget
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine, generate_batch
from specdec.models import LoadedModel, load_model
from specdec.models.state import ModelState
from specdec.proposers import parse_method
from specdec.tree import DraftTree

TREE = DraftTree(torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.tensor([-1, 0, 1, 0, 3, 3, 1]))


def _tiny(backend: str, layers: int = 2) -> LoadedModel:
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    )  # fmt: skip
    torch.manual_seed(0)
    return LoadedModel(LlamaForCausalLM(config).eval(), None, "tiny-llama", pack="off", backend=backend)


def test_compiled_with_exact_is_refused_before_loading():
    with pytest.raises(ValueError, match="cannot be combined"):
        load_model("/no/such/model", dtype="bf16", backend="compiled", exact="on")


def _greedy(rows: BatchedTarget, prompt: list[int], steps: int) -> list[int]:
    _, logits, _ = rows.add(prompt)
    out = [int(logits.argmax())]
    for _ in range(steps):
        last = rows.verify_trees([DraftTree.chain(out[-1], [])])[0][0]
        rows.commit([[0]])
        out.append(int(last[0].argmax()))
    return out


def test_the_windowed_cache_gives_the_eager_passes_logits():
    """The compiled path's inputs and cache (keys through `BatchLayout.window`, 2+ nodes, the mask
    over the window), run by the eager forward: the same logits as the ordinary batched path, for
    trees and chains across the cache's growth. Fast: nothing compiles."""
    model = _tiny("torch").model
    single = TargetModel(model)
    windowed = BatchedTarget(single, lambda inputs, capture, window: single.forward_pass(inputs, False, capture))
    plain = BatchedTarget(TargetModel(model))
    prompt = torch.randint(0, 512, (240,), generator=torch.Generator().manual_seed(3)).tolist()
    for rows in (windowed, plain):
        rows.add(prompt)
    torch.testing.assert_close(windowed.verify_trees([TREE])[0][0], plain.verify_trees([TREE])[0][0])
    for rows in (windowed, plain):
        rows.commit([[0, 3, 4]])
    assert windowed._layers[0].capacity == 256
    for step in range(16):  # one-token passes, past the first 256 entries: the buffers double
        token = DraftTree.chain(7 + step, [])
        torch.testing.assert_close(windowed.verify_trees([token])[0][0], plain.verify_trees([token])[0][0])
        for rows in (windowed, plain):
            rows.commit([[0]])
    assert windowed._layers[0].capacity == 512 and windowed.layout.window is None


@pytest.mark.slow
def test_compiled_pass_matches_the_eager_one():
    """Tree logits equal the eager pass's (fp32, to summation order), and greedy decoding across the
    cache's growth (capacity 256 -> 512: a recompile) gives the eager backend's tokens."""
    model = _tiny("compiled").model
    target = CompiledTarget(model)
    eager, compiled = BatchedTarget(TargetModel(model)), BatchedTarget(target, target.compiled)
    prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    for rows in (eager, compiled):
        rows.add(prompt)
    want, got = eager.verify_trees([TREE])[0][0], compiled.verify_trees([TREE])[0][0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert compiled.compiled.failure is None
    long_prompt = torch.randint(0, 512, (240,), generator=torch.Generator().manual_seed(2)).tolist()
    fresh_eager = BatchedTarget(TargetModel(model))
    target = CompiledTarget(model)
    fresh_compiled = BatchedTarget(target, target.compiled)
    assert _greedy(fresh_compiled, long_prompt, 30) == _greedy(fresh_eager, long_prompt, 30)
    assert fresh_compiled._layers[0].capacity >= 256 + 16 and target.compiled.failure is None


@pytest.mark.slow
def test_a_failing_compiler_falls_back_to_the_eager_pass():
    import torch._inductor.config as inductor_config

    model = _tiny("compiled", layers=3).model  # a shape no earlier test compiled: this one must compile
    target = CompiledTarget(model)
    rows, eager = BatchedTarget(target, target.compiled), BatchedTarget(TargetModel(model))
    prompt = list(range(100, 140))
    with inductor_config.patch({"cpp.cxx": ("/no/such/c++",), "force_disable_caches": True}):
        with pytest.warns(RuntimeWarning, match="compiling the verification pass failed"):
            got = _greedy(rows, prompt, 6)
    assert target.compiled.failure
    assert got == _greedy(eager, prompt, 6)


@pytest.fixture(scope="module")
def tiny_compiled(tiny):
    """The tiny random target (fp32, the real tokenizer's vocabulary) on the compiled backend, with the
    suite's fixed cost curve. A tiny graph compiles in seconds where the bundled model's took 3-4
    minutes a graph, cold, on a 2-core CPU, and every tree, batch and capture path is the same code."""
    return save_fixed_costs(dataclasses.replace(tiny, backend="compiled", state=ModelState()))


@pytest.fixture(scope="module")
def random_eagle_head(tiny, tmp_path_factory) -> str:
    """An untrained EAGLE-3 head over the tiny target (its layers 1, 3, 4 captured by the pass)."""
    from specdec.proposers.eagle.head import Eagle3Head, head_config, save_head

    torch.manual_seed(0)
    head = Eagle3Head(head_config(tiny.model.config, (1, 3, 4), 128), tiny.model.get_input_embeddings())
    head.set_vocab(torch.arange(128))
    folder = tmp_path_factory.mktemp("eagle") / "head"
    save_head(head, folder)
    return str(folder)


def _run(engine: Engine, prompts: list[list[int]], method: str) -> list[list[int]]:
    loaded = engine.loaded
    settings = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    if len(prompts) == 1:
        return [engine.generate(prompts[0], parse_method(method).build(loaded), settings).token_ids]
    outs = generate_batch(engine, prompts, lambda: parse_method(method).build(loaded), settings, max_batch=len(prompts))
    return [out.token_ids for out in outs]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "logitspec", "eagle"])
def test_methods_are_lossless_on_the_compiled_backend(tiny, tiny_compiled, random_eagle_head, method):
    """Over 60 s on a cold inductor cache (CI's): the first case compiles each of the pass's graphs (one
    row and two, prefill chunks, grown caches), a C++ build each; later cases reuse them."""
    if method == "eagle":  # the head reads hidden states the compiled pass captures
        method = f"eagle:head={random_eagle_head},adaptive=false,topk=2"
    compiled, eager = Engine(tiny_compiled), Engine(tiny, attention="sdpa")
    prompts = [tiny.tokenizer(text)["input_ids"] for text in TEXTS[:2]]
    plain = [_run(compiled, [p], "plain")[0] for p in prompts]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback: the compiled pass ran
        single = _run(compiled, prompts[:1], method)[0]
    assert single == plain[0] == _run(eager, prompts[:1], "plain")[0]  # fp32: the eager backend's text too
    assert _run(compiled, prompts, method) == plain  # the batched path


@pytest.mark.slow
def test_compiled_pass_runs_int4_weights():
    """The 4-bit view (bf16: specdec's 4-bit kernel where it builds, else PyTorch's int4 kernel) compiles:
    its tree logits are the eager pass's, to bf16 rounding, and no fallback was taken."""
    from specdec.backends.torch.int4 import Int4Linear
    from specdec.backends.torch.packed import packed_view
    from specdec.kernels import q4_kernel

    view = packed_view(_tiny("compiled", layers=1).model.to(torch.bfloat16), int4=True)
    kind = q4_kernel.Q4Linear if q4_kernel.load_extension() else Int4Linear
    assert any(type(m) is kind for m in view.modules())
    target = CompiledTarget(view)
    eager, compiled = BatchedTarget(TargetModel(view)), BatchedTarget(target, target.compiled)
    prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    for rows in (eager, compiled):
        rows.add(prompt)
    torch._dynamo.utils.counters.clear()
    want, got = eager.verify_trees([TREE])[0][0], compiled.verify_trees([TREE])[0][0]
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert target.compiled.failure is None and torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1

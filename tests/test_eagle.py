"""EAGLE-3 heads: the checkpoint layout, training, and lossless drafting on a tiny target.

The tiny target shares the bundled tokenizer's vocabulary (so real text trains
it), with few, narrow layers; its heads are trained here for a few steps. The
shipped head on the real model is tested in test_eagle_shipped.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TEXTS, TRAIN, on_meta, tiny_target
from safetensors.torch import load_file, save_file

from specdec.drafters.features import collate, load_cache
from specdec.drafters.train import TrainConfig, train, ttt_loss
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine, generate_batch
from specdec.proposers import make_config
from specdec.proposers.eagle.device_tree import catch_up_step, tree_step
from specdec.proposers.eagle.head import (
    Eagle3Head,
    HeadError,
    default_layer_ids,
    head_config,
    load_head,
    save_head,
)
from specdec.proposers.plain import PlainProposer
from specdec.proposers.tree_budget import min_score
from specdec.tree import DraftTree


@pytest.fixture(scope="module")
def trained(tiny, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("head")
    config = TrainConfig(str(data_file), str(out), **TRAIN)
    return out, train(tiny, config, log=lambda _: None)


def test_head_folder_is_the_eagle3_layout(trained):
    out, summary = trained
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 256 and config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(default_layer_ids(6))
    names = set(load_file(str(out / "model.safetensors")))
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
                "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight"}  # fmt: skip
    expected |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    expected |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert names == expected
    assert len(summary["heldout_accuracy"]) == 3


def test_training_lowers_the_loss_and_resume_continues_exactly(tiny, data_file, trained, tmp_path):
    out, summary = trained
    examples = load_cache(out / "features")
    head = load_head(out, tiny.model, torch.float32)
    to_draft = torch.full((tiny.model.config.vocab_size,), -100, dtype=torch.int64)
    to_draft[head.draft_ids] = torch.arange(head.d2t.numel())
    untrained = Eagle3Head(head.config, tiny.model.get_input_embeddings())
    untrained.load_state_dict({k: v for k, v in head.state_dict().items() if k in ("d2t", "t2d")}, strict=False)
    batch = collate(examples[:8])
    with torch.no_grad():
        before = ttt_loss(untrained, *batch, 3, to_draft)[0]
        after = ttt_loss(head, *batch, 3, to_draft)[0]
    assert float(after) < float(before)

    # Stopped at step 7 (inside the second epoch) and resumed: the same head as the run that went through.
    cache = str(out / "features")
    train(tiny, TrainConfig(str(data_file), str(tmp_path), max_steps=7, cache=cache, **TRAIN), log=lambda _: None)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == 7
    train(tiny, TrainConfig(str(data_file), str(tmp_path), resume=True, cache=cache, **TRAIN), log=lambda _: None)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == summary["steps"] > 7
    a, b = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


def test_bad_heads_get_clear_errors(tiny, trained, tmp_path, default_model):
    out, _ = trained
    with pytest.raises(HeadError, match="no config.json"):
        load_head(tmp_path, tiny.model)
    other = tiny_target(len(default_model.tokenizer), seed=1)
    with pytest.raises(HeadError, match="trained for"):
        load_head(out, other)
    small = tiny_target(1000)
    with pytest.raises(HeadError, match="vocabulary"):
        load_head(out, small)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    del weights["d2t"]
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(HeadError, match="no d2t"):
        load_head(broken, tiny.model)


def test_bad_training_data_gets_a_clear_error(tiny, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text('{"nothing": 1}\nnot json\n')
    with pytest.raises(ValueError, match="no usable rows"):
        train(tiny, TrainConfig(str(path), str(tmp_path / "out")), log=lambda _: None)


def test_a_checkpoint_from_elsewhere_loads_and_drafts(tiny, tmp_path):
    """A head written as other tools write it (`layers.0.` names, the embedding included, no t2d)."""
    config = head_config(tiny.model.config, (1, 3, 4), 128)
    head = Eagle3Head(config, tiny.model.get_input_embeddings())
    head.set_vocab(torch.arange(128) * 3)
    state = {k.replace("midlayer.", "layers.0."): v for k, v in head.state().items() if k != "t2d"}
    state["embed_tokens.weight"] = tiny.model.get_input_embeddings().weight.detach().clone()
    folder = tmp_path / "other"
    save_head(head, folder)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    loaded = load_head(folder, tiny.model)
    assert loaded.layer_ids == (1, 3, 4)
    assert torch.equal(loaded.draft_ids, torch.arange(128) * 3)
    assert int(loaded.t2d.sum()) == 128


@pytest.mark.parametrize(
    "options",
    [
        {"adaptive": "false", "budget": "16"},
        {"adaptive": "false", "topk": "2"},
        {"retrieval": "true", "adaptive": "false", "budget": "24"},
    ],
)
def test_eagle_is_lossless_on_the_tiny_target(tiny, trained, options):
    out, _ = trained
    engine = Engine(tiny, attention="sdpa")
    tok = tiny.tokenizer
    prompts = [tok(t)["input_ids"] for t in TEXTS[:4]]
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    method = make_config("eagle", {"head": str(out), **options})
    plain = [engine.generate(p, PlainProposer(), config).token_ids for p in prompts]
    solo = [engine.generate(p, method.build(tiny), config) for p in prompts]
    assert [o.token_ids for o in solo] == plain
    assert any(o.stats.mat > 1.0 for o in solo)  # the trained head drafts tokens the target keeps
    batched = generate_batch(engine, prompts, lambda: method.build(tiny), config, max_batch=3)
    assert [o.token_ids for o in batched] == plain


def test_the_shipped_head_on_8_bit_blocks_stays_within_its_bound(default_model):
    """How the shipped EAGLE-3 head drafts on a CPU (`blocks`, the default: fc, the layer's products and the
    draft vocabulary's head on Q8_0 blocks with 8-bit activations) against the same head in fp32, one step over
    SmolLM2's own features of a real prompt: per row every logit within 3% of the row's largest |logit|, and
    the same top-1 guess on at least 90% of rows (the bound the Medusa and Hydra heads keep). Only drafts
    change; the lossless matrix runs this head."""
    from specdec.kernels import q4_kernel

    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    ids = default_model.tokenizer("The mitochondria is the powerhouse of the cell, and it makes")["input_ids"]
    blocks, reference = (make_config("eagle", {"blocks": on}).load(default_model) for on in (True, False))
    assert not any(isinstance(m, torch.nn.Linear) for m in blocks.modules())
    assert reference.dtype == torch.float32 and blocks is not reference
    with torch.inference_mode():
        states = default_model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        features = torch.cat([states[i] for i in reference.layer_ids], -1)[:, :-1]  # position t: token t + 1 next
        tokens, positions = torch.tensor([ids[1:]]), torch.arange(len(ids) - 1)[None]
        causal = torch.ones(len(ids) - 1, len(ids) - 1, dtype=torch.bool).tril()[None, None]
        got, want = (
            head.finish(hidden, *head.qkv(hidden, tokens, positions), causal)[0][0]
            for head in (blocks, reference)
            for hidden in [head.fuse(features)]
        )
    bound = 0.03 * want.abs().amax(-1, keepdim=True)
    assert bool(((got - want).abs() <= bound).all()), float((got - want).abs().max())
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


@pytest.mark.parametrize("blocks", [False, True], ids=["fp32", "blocks"])
def test_the_tree_grown_on_the_device_is_the_hosts(default_model, engine, blocks):
    """A GPU feeds the head the committed positions and grows the whole top-k tree at fixed shapes
    (`device_tree`: the catch-up's rows padded to a bucket; `topk` rows a level, chosen by torch.topk; the
    committed entries in a power-of-two buffer, the tree's entries in fixed slots), so one CUDA graph serves
    each and one transfer brings the tree back. On the CPU the same steps run eagerly: over a real generation
    with the shipped head, every step's tree is the one the eager catch-up, the host's heap and `HeadSteps`
    draft, and the text is plain's."""
    prompt = default_model.tokenizer("The three primary colours are red, yellow and")["input_ids"]
    config = GenerationConfig(max_new_tokens=24)
    # narrow and deep: trees reach five levels and more, where a mask that lost a row's ancestors shows
    method = make_config("eagle", {"blocks": str(blocks).lower(), "adaptive": "false", "budget": "40", "topk": "4",
                                   "min_prob": "0.01"})
    runs = []
    for on_device in (False, True):
        proposer, trees = method.build(default_model), []
        proposer.device_tree = on_device
        propose = proposer.propose

        def recorded(ctx, propose=propose, trees=trees):  # noqa: ANN001, ANN202 - the proposer's own call
            tree = propose(ctx)
            trees.append((tree.token_list, tree.parent_list))
            return tree

        proposer.propose = recorded
        runs.append((engine.generate(prompt, proposer, config).token_ids, trees))
    (text, trees), (device_text, device_trees) = runs
    assert device_trees == trees and device_text == text
    assert max(DraftTree.of_lists(*tree).max_depth for tree in trees) >= 5


def test_the_device_tree_reads_nothing_back(default_model):
    """One wait a tree: the tree step reads no value before it ends. On the meta device, where any read
    fails, it runs to the end and hands back the likeliest budget - 1 nodes' scores (float64), tokens,
    parents, depths and numbers for the one transfer; the catch-up before it reads nothing either."""
    head = on_meta(make_config("eagle", {"blocks": "false"}).load(default_model))
    attn, hidden = head.midlayer.self_attn, head.fc.weight.shape[0]
    kv = attn.k_proj.weight.shape[0] // attn.head_dim
    entries = [torch.empty(1, kv, 64, attn.head_dim, device="meta") for _ in range(2)]
    with torch.inference_mode():
        found = tree_step(head, head.draft_ids, 8, min_score(0.05), 48, (6, 64),
                          torch.empty(head.draft_ids.shape[0], device="meta"), torch.empty(hidden, device="meta"),
                          *entries, torch.empty(2, dtype=torch.int64, device="meta"))
    assert [tuple(t.shape) for t in found] == [(47,)] * 5
    assert [t.dtype for t in found] == [torch.float64] + [torch.int64] * 4
    with torch.inference_mode():  # the catch-up before it: 3 new positions in a bucket of 4, 60 entries fed
        features = torch.empty(4, head.fc.weight.shape[1], device="meta")
        ints = torch.empty(2 * 4 + 2, dtype=torch.int64, device="meta")
        logits, state, keys, values = catch_up_step(head, (4, 64), features, ints, *entries)
    assert (logits.shape, state.shape, keys.shape) == ((head.draft_ids.shape[0],), (hidden,), (1, kv, 4, attn.head_dim))

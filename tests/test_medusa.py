"""Medusa heads: the checkpoint layout, training, and lossless drafting on a tiny target.

The tiny target and its training text are test_eagle's; its heads are trained
here for a few steps. The shipped heads on the real model are tested in the
lossless matrix (test_lossless.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TEXTS, TRAIN, assert_resume_is_exact, tiny_target
from safetensors.torch import load_file, save_file

from specdec.drafters.features import collate, load_cache
from specdec.drafters.train import TrainConfig, train
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine, generate_batch
from specdec.proposers import make_config
from specdec.proposers.eagle.head import HeadError
from specdec.proposers.medusa.head import MedusaHeads, load_medusa, medusa_loss, save_medusa
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams

MEDUSA = {**TRAIN, "arch": "medusa", "heads": 3}


@pytest.fixture(scope="module")
def trained(tiny, data_file, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("medusa")
    return out, train(tiny, TrainConfig(str(data_file), str(out), **MEDUSA), log=lambda _: None)


def test_heads_folder_is_vllms_medusa_layout(trained):
    out, summary = trained
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MedusaModel"] and config["model_type"] == "medusa"
    assert (config["num_heads"], config["num_hidden_layers"], config["truncated_vocab_size"]) == (3, 1, 256)
    names = set(load_file(str(out / "model.safetensors")))
    expected = {"token_map"} | {f"lm_heads.{i}.weight" for i in range(3)}
    expected |= {f"blocks.{i}.layers.0.{p}" for i in range(3) for p in ("weight", "bias")}
    assert names == expected
    assert summary["layer_ids"] == [6] and len(summary["heldout_accuracy"]) == 3


def test_training_lowers_the_loss_and_resume_continues_exactly(tiny, data_file, trained, tmp_path):  # noqa: F811
    out, summary = trained
    examples = load_cache(out / "features")
    heads = load_medusa(out, tiny.model, torch.float32)
    to_draft = torch.full((tiny.model.config.vocab_size,), -100, dtype=torch.int64)
    to_draft[heads.token_map] = torch.arange(heads.token_map.numel())
    untrained = MedusaHeads(64, tiny.model.config.vocab_size, 256, 3, 6)
    _, labels, features, valid = collate(examples[:8])
    with torch.no_grad():
        before = medusa_loss(untrained, labels, features, valid, to_draft)[0]
        after = medusa_loss(heads, labels, features, valid, to_draft)[0]
    assert float(after) < float(before)
    assert_resume_is_exact(tiny, data_file, out, summary["steps"], tmp_path, MEDUSA)


def test_an_eagle_feature_cache_is_refused_for_medusa(tiny, data_file, tmp_path):  # noqa: F811
    cache = tmp_path / "features"
    train(tiny, TrainConfig(str(data_file), str(tmp_path / "e"), cache=str(cache), max_steps=1, **TRAIN),
          log=lambda _: None)
    with pytest.raises(ValueError, match="another target, layers"):
        train(tiny, TrainConfig(str(data_file), str(tmp_path / "m"), cache=str(cache), **MEDUSA), log=lambda _: None)


def test_bad_heads_get_clear_errors(tiny, trained, tmp_path, default_model):  # noqa: F811
    out, _ = trained
    with pytest.raises(HeadError, match="no config.json"):
        load_medusa(tmp_path, tiny.model)
    with pytest.raises(HeadError, match="trained for"):
        load_medusa(out, tiny_target(len(default_model.tokenizer), seed=1))
    with pytest.raises(HeadError, match="vocabulary"):
        load_medusa(out, tiny_target(1000))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    del weights["token_map"]
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(HeadError, match="no token_map"):
        load_medusa(broken, tiny.model)
    with pytest.raises(ValueError, match="--arch"):
        TrainConfig("x", "y", arch="medusa2")


def test_fasterdecoding_names_load(tiny, tmp_path):  # noqa: F811
    """A checkpoint with the original Medusa repository's tensor names and config keys loads."""
    heads = MedusaHeads(64, tiny.model.config.vocab_size, tiny.model.config.vocab_size, 2, 6)
    torch.nn.init.normal_(heads.blocks[1].layers[0].weight)
    folder = save_medusa(heads, tmp_path / "orig")
    config = json.loads((folder / "config.json").read_text())
    config["medusa_num_heads"] = config.pop("num_heads")
    (folder / "config.json").write_text(json.dumps(config))
    old = {}
    for i in range(2):
        old[f"{i}.0.linear.weight"] = heads.blocks[i].layers[0].weight
        old[f"{i}.0.linear.bias"] = heads.blocks[i].layers[0].bias
        old[f"{i}.1.weight"] = heads.lm_heads[i].weight
    save_file({k: v.detach().contiguous() for k, v in old.items()}, str(folder / "model.safetensors"))
    loaded = load_medusa(folder, tiny.model, torch.float32)
    assert loaded.num_heads == 2
    torch.testing.assert_close(loaded.blocks[1].layers[0].weight, heads.blocks[1].layers[0].weight.detach())


@pytest.mark.parametrize("options", [{"adaptive": "false", "budget": "16"}, {"adaptive": "false", "topk": "2"}])
def test_medusa_is_lossless_on_the_tiny_target(tiny, trained, options):  # noqa: F811
    out, _ = trained
    engine = Engine(tiny, attention="sdpa")
    prompts = [tiny.tokenizer(t)["input_ids"] for t in TEXTS[:4]]
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    method = make_config("medusa", {"head": str(out), **options})
    plain = [engine.generate(p, PlainProposer(), config).token_ids for p in prompts]
    solo = [engine.generate(p, method.build(tiny), config) for p in prompts]
    assert [o.token_ids for o in solo] == plain
    assert any(o.stats.mat > 1.0 for o in solo)  # the trained heads draft tokens the target keeps
    batched = generate_batch(engine, prompts, lambda: method.build(tiny), config, max_batch=3)
    assert [o.token_ids for o in batched] == plain
    sampled = GenerationConfig(max_new_tokens=24, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=3))
    assert engine.generate(prompts[0], method.build(tiny), sampled).token_ids == engine.generate(
        prompts[0], PlainProposer(), sampled
    ).token_ids  # deterministic drafts: seeded sampling emits plain sampling's tokens


def test_a_full_vocabulary_export_loads_back(tiny, trained, tmp_path):  # noqa: F811
    """`full_vocab=True` (for vLLM, which allocates every head at the full vocabulary): the draft rows
    in place, zeros elsewhere, no token_map; it loads back with the same draft rows."""
    out, _ = trained
    heads = load_medusa(out, tiny.model, torch.float32)
    folder = save_medusa(heads, tmp_path / "full", full_vocab=True)
    assert "token_map" not in load_file(str(folder / "model.safetensors"))
    full = load_medusa(folder, tiny.model, torch.float32)
    assert torch.equal(full.token_map, torch.arange(tiny.model.config.vocab_size))
    for mine, theirs in zip(heads.lm_heads, full.lm_heads, strict=True):
        assert torch.equal(theirs.weight[heads.token_map], mine.weight)
        assert int((theirs.weight.abs().sum(1) > 0).sum()) <= heads.token_map.numel()


def test_the_shipped_heads_on_8_bit_blocks_stay_within_their_bound(default_model):
    """How the shipped Medusa and Hydra heads draft on a CPU (`blocks`, the default: every product on
    Q8_0 blocks with 8-bit activations) against the same heads in fp32, on SmolLM2's own last states of
    a real prompt: per row every logit within 3% of the row's largest |logit| (~1% seen), and the same
    top-1 guess on at least 90% of rows. Only drafts change; the lossless matrix runs these heads."""
    from specdec.kernels import q4_kernel

    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    ids = default_model.tokenizer("The mitochondria is the powerhouse of the cell, and it makes")["input_ids"]
    with torch.inference_mode():
        states = default_model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    for name in ("medusa", "hydra"):
        blocks, reference = (make_config(name, {"blocks": on}).load(default_model) for on in ("true", "false"))
        assert not any(isinstance(m, torch.nn.Linear) for m in blocks.modules()), name
        assert reference.dtype == torch.float32 and blocks is not reference
        for i in range(blocks.num_heads):
            with torch.inference_mode():
                if name == "medusa":
                    got, want = (h.head_product(i, h.blocks[i](states.to(h.dtype))) for h in (blocks, reference))
                else:
                    branch = torch.tensor([ids[t + 1 : t + 2 + i] for t in range(len(ids) - 1 - i)])
                    got, want = (h.head_logits(i, states[: len(branch)], branch) for h in (blocks, reference))
            bound = 0.03 * want.abs().amax(-1, keepdim=True)
            assert bool(((got - want).abs() <= bound).all()), (name, i, float((got - want).abs().max()))
            assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9, (name, i)

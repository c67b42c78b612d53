"""Hydra heads: layout, training (loss falls, resume is exact), branch-dependent drafting, losslessness.

The tiny target and its training text are the Medusa tests' (conftest's `tiny`,
`data_file`); on the bundled model the heads are the ones shipped for it
(`specdec/heads/smollm2-135m-instruct-hydra`), found as `hydra` finds them by default.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TEXTS, TRAIN, assert_resume_is_exact, on_meta
from safetensors.torch import load_file

from specdec.drafters.features import collate, load_cache
from specdec.drafters.train import TrainConfig, train
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.loop import Engine, generate_batch
from specdec.proposers import make_config
from specdec.proposers.eagle.head import HeadError
from specdec.proposers.hydra.head import HydraHeads, hydra_loss, start_as_medusa
from specdec.proposers.hydra.proposer import tree_step
from specdec.proposers.medusa.head import MedusaHeads, heads_loss, load_medusa, save_medusa
from specdec.proposers.plain import PlainProposer
from specdec.proposers.tree_budget import min_score
from specdec.sampling import SamplingParams

HYDRA = {**TRAIN, "arch": "hydra", "heads": 3}


@pytest.fixture(scope="module")
def trained(tiny, data_file, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("hydra")
    return out, train(tiny, TrainConfig(str(data_file), str(out), **HYDRA), log=lambda _: None)


def test_heads_folder_is_medusas_layout_saying_hydra(trained):
    out, summary = trained
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["HydraModel"] and config["model_type"] == "hydra"
    assert (config["num_heads"], config["num_hidden_layers"], config["truncated_vocab_size"]) == (3, 1, 256)
    weights = load_file(str(out / "model.safetensors"))
    expected = {"token_map"} | {f"lm_heads.{i}.weight" for i in range(3)}
    expected |= {f"{part}.{i}.{p}" for i in range(3) for part in ("blocks", "inputs") for p in ("weight", "bias")}
    assert {n.replace(".layers.0.", ".") for n in weights} == expected
    assert weights["inputs.2.weight"].shape == (64, 4 * 64)  # head 2 reads the state and 3 branch tokens
    assert summary["layer_ids"] == [6] and len(summary["heldout_accuracy"]) == 3
    assert "# Hydra heads" in (out / "README.md").read_text()


def test_training_lowers_the_loss_and_resume_continues_exactly(tiny, data_file, trained, tmp_path):  # noqa: F811
    out, summary = trained
    examples = load_cache(out / "features")
    heads = load_medusa(out, tiny.model, torch.float32, kind=HydraHeads)
    to_draft = torch.full((tiny.model.config.vocab_size,), -100, dtype=torch.int64)
    to_draft[heads.token_map] = torch.arange(heads.token_map.numel())
    untrained = HydraHeads(64, tiny.model.config.vocab_size, 256, 3, 6)
    untrained.bind(tiny.model)
    tokens, labels, features, valid = collate(examples[:8])
    with torch.no_grad():
        before = hydra_loss(untrained, tokens, labels, features, valid, to_draft)[0]
        after = hydra_loss(heads, tokens, labels, features, valid, to_draft)[0]
    assert float(after) < float(before)
    assert_resume_is_exact(tiny, data_file, out, summary["steps"], tmp_path, HYDRA)


def test_a_fresh_hydra_head_is_its_medusa_head(tiny):  # noqa: F811
    """Zeroed input layers: head i's logits are Medusa head i's, whatever the branch."""
    torch.manual_seed(0)
    hydra = HydraHeads(64, tiny.model.config.vocab_size, 256, 2, 6)
    hydra.bind(tiny.model)
    start_as_medusa(hydra)
    medusa = MedusaHeads(64, tiny.model.config.vocab_size, 256, 2, 6)
    medusa.load_state_dict({k: v for k, v in hydra.state_dict().items() if not k.startswith("inputs.")})
    hidden = torch.randn(5, 64)
    tokens, features = torch.randint(0, 100, (1, 5)), hidden[None]
    valid, labels = torch.ones(1, 5, dtype=torch.bool), torch.randint(0, 256, (1, 5))
    to_draft = torch.arange(tiny.model.config.vocab_size).clamp(max=255)
    with torch.no_grad():
        for i, logits in enumerate(hydra.train_logits(tokens, features)):
            torch.testing.assert_close(logits[0], medusa.logits(hidden)[i])
        assert heads_loss(medusa.logits(features), labels, valid, to_draft)[0] == pytest.approx(
            float(hydra_loss(hydra, tokens, labels, features, valid, to_draft)[0])
        )
    with pytest.raises(ValueError, match="reads 2 branch tokens"):
        hydra.head_logits(1, hidden[:1], tokens[:, :1])


def test_children_depend_on_their_branch(tiny, trained):  # noqa: F811
    """Unlike Medusa's product tree, siblings' children differ: each level is guessed for its parent."""
    out, _ = trained
    options = {"head": str(out), "adaptive": "false", "min_prob": "0", "blocks": "false"}  # weights changed below
    proposer = make_config("hydra", options).build(tiny)
    with torch.no_grad():
        for layer in proposer.heads.inputs:  # make the branch matter a lot, whatever was learned
            torch.nn.init.normal_(layer.weight, std=5.0)  # the tiny target's embeddings are small
    state = torch.zeros(64)  # nothing shared by the branches but the state: only the branch tells them apart
    ctx = ProposalContext([1, 2, 3], torch.zeros(tiny.model.config.vocab_size), 3, SamplingParams(), 3, state[None])
    tree = proposer.propose(ctx)
    children = [sorted(tree.token_list[c] for c in tree.children[n]) for n in tree.children[0] if tree.children[n]]
    assert len(children) >= 2 and len({tuple(c) for c in children}) > 1


def test_the_tree_grown_on_the_device_is_the_hosts(tiny, trained):  # noqa: F811
    """A GPU grows the whole tree on the device (`tree_step`: every level `topk` rows chosen by torch.topk,
    each with its branch), one CUDA graph and one wait a tree (`GraphedCall`): on the CPU, run eagerly, it
    gives the tree the host's heap chose level by level."""
    out, _ = trained
    options = {"head": str(out), "adaptive": "false", "min_prob": "0", "blocks": "false", "topk": "3"}
    proposer = make_config("hydra", options).build(tiny)
    with torch.no_grad():
        for layer in proposer.heads.inputs:
            torch.nn.init.normal_(layer.weight, std=5.0)
    state = torch.randn(64, generator=torch.Generator().manual_seed(0))
    ctx = ProposalContext([1, 2, 3], torch.zeros(tiny.model.config.vocab_size), 3, SamplingParams(), 3, state[None])
    trees = []
    for on_device in (False, True):
        proposer.device_tree = on_device
        trees.append(proposer.propose(ctx))
    assert trees[1].token_list == trees[0].token_list and trees[1].parent_list == trees[0].parent_list
    assert trees[0].max_depth >= 3 and trees[0].num_nodes > 1 + 3 + 3  # past the first level's one row


def test_the_device_tree_reads_nothing_back(tiny, trained):  # noqa: F811
    """One wait a tree: on the meta device, where any read of a value fails, the tree step runs to the end and
    hands back the likeliest budget - 1 nodes for the one transfer."""
    out, _ = trained
    heads = on_meta(make_config("hydra", {"head": str(out), "blocks": "false"}).load(tiny))
    with torch.inference_mode():
        found = tree_step(heads, 3, min_score(0.0), 16, 3, torch.empty(64, device="meta"),
                          torch.empty(1, dtype=torch.int64, device="meta"))
    assert [tuple(t.shape) for t in found] == [(15,)] * 5


def test_hydra_and_medusa_heads_are_not_mixed_up(tiny, trained, tmp_path):  # noqa: F811
    out, _ = trained
    with pytest.raises(HeadError, match="not MedusaModel"):
        load_medusa(out, tiny.model)
    medusa = save_medusa(MedusaHeads(64, tiny.model.config.vocab_size, 256, 2, 6), tmp_path / "m")
    with pytest.raises(HeadError, match="not HydraModel"):
        load_medusa(medusa, tiny.model, kind=HydraHeads)


def test_hydra_is_lossless_on_the_tiny_target(tiny, trained):  # noqa: F811
    out, _ = trained
    engine = Engine(tiny, attention="sdpa")
    prompts = [tiny.tokenizer(t)["input_ids"] for t in TEXTS[:4]]
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    method = make_config("hydra", {"head": str(out), "adaptive": "false", "budget": "16"})
    plain = [engine.generate(p, PlainProposer(), config).token_ids for p in prompts]
    solo = [engine.generate(p, method.build(tiny), config) for p in prompts]
    assert [o.token_ids for o in solo] == plain
    assert any(o.stats.mat > 1.0 for o in solo)  # the trained heads draft tokens the target keeps
    batched = generate_batch(engine, prompts, lambda: method.build(tiny), config, max_batch=3)
    assert [o.token_ids for o in batched] == plain


@pytest.mark.slow
def test_hydra_greedy_is_plain_on_the_bundled_model(default_model, engine, plain_runs, bench_prompts):
    """fp32, the real model and the Hydra heads shipped for it: greedy output token-identical to plain's,
    alone and batched, and the heads' drafts are accepted (more than one token per pass)."""
    names = ["mt_bench", "qa"]
    config = GenerationConfig(max_new_tokens=32)
    method = make_config("hydra", {})
    assert method.load(default_model).__class__ is HydraHeads
    solo = [engine.generate(bench_prompts[n], method.build(default_model), config) for n in names]
    plain = [plain_runs.tokens(n, 32) for n in names]
    assert [o.token_ids for o in solo] == plain
    assert all(o.stats.mat > 1.0 for o in solo)
    batched = generate_batch(engine, [bench_prompts[n] for n in names], lambda: method.build(default_model), config,
                             max_batch=2)  # fmt: skip
    assert [o.token_ids for o in batched] == plain

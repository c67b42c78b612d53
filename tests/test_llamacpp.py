"""The llama.cpp backend (`specdec.backends.llamacpp`): trees as sequences, rows as sequences, clear refusals.

The tree checks compare logits with exact equality: on a context whose cells hold
only the row at hand, llama.cpp computes a tree node with the same bits as the node's
path decoded as a chain, so a wrong sequence assignment (a node seeing a sibling, or
missing an ancestor) shows up as a difference, not as noise.
"""

import dataclasses

import pytest
import torch
from helpers import save_fixed_costs

pytest.importorskip("llama_cpp")

from specdec.backends.llamacpp import MAX_SEQUENCES, LlamaCppModel  # noqa: E402
from specdec.backends.registry import llamacpp_model  # noqa: E402
from specdec.choices import ModelSpec  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine, generate_batch  # noqa: E402
from specdec.errors import ModelLoadError  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.models.state import ModelState  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.tree import DraftTree  # noqa: E402

PROMPT = list(range(1000, 1100))
# Seconds per exact pass of the default model on llama.cpp (2-core AVX-512 machine, idle)
LLAMACPP_EXACT_COSTS = {1: 0.0146, 2: 0.0146, 4: 0.021, 8: 0.0326, 16: 0.0547, 32: 0.1, 64: 0.19}
TREE = DraftTree(torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.tensor([-1, 0, 1, 0, 3, 3, 1]))


@pytest.fixture(scope="module")
def on_llamacpp(default_model):
    """The default model with backend llamacpp (state of its own: one llama.cpp context)."""
    return dataclasses.replace(default_model, backend="llamacpp", state=ModelState())


@pytest.fixture(scope="module")
def context(on_llamacpp) -> LlamaCppModel:
    return llamacpp_model(on_llamacpp)


def _chain_logits(context: LlamaCppModel, tokens: list[int]) -> torch.Tensor:
    batch = context.batched()
    batch.add(PROMPT)
    logits = batch.verify_trees([DraftTree.chain(tokens[0], tokens[1:])])[0][0]
    batch.release()
    return logits


def test_tree_nodes_see_their_path_only(context):
    batch = context.batched()
    batch.add(PROMPT)
    logits, features = batch.verify_trees([TREE])[0]
    batch.release()
    assert features is None and logits.shape == (TREE.num_nodes, context.vocab_size)
    for node in range(TREE.num_nodes):
        expected = _chain_logits(context, TREE.path_tokens(node))[-1]
        assert torch.equal(logits[node], expected), f"node {node}: path {TREE.path(node)}"


def test_commit_keeps_the_accepted_path(context):
    batch = context.batched()
    batch.add(PROMPT)
    batch.verify_trees([TREE])
    batch.commit([[0, 3, 4]])  # a branch that is not the first leaf's
    assert batch.lengths == [len(PROMPT) + 3]
    after = batch.verify_trees([DraftTree.chain(12)])[0][0][0]
    batch.release()
    assert torch.equal(after, _chain_logits(context, [5, 8, 9, 12])[-1])


def test_sequences_come_back(context):
    free = len(context.free_sequences)
    batch = context.batched()
    for prompt in (PROMPT, PROMPT[:40], PROMPT[:70]):
        batch.add(prompt)
    batch.verify_trees([TREE, DraftTree.chain(3, [4]), TREE])
    batch.commit([[0, 1], [0], [0, 3, 5]])
    assert batch.lengths == [102, 41, 73]
    assert batch.remove(0) == 2 and batch.lengths == [73, 41]
    batch.release()
    assert len(context.free_sequences) == free == MAX_SEQUENCES - 1  # every earlier test released its rows
    assert all(context.lib.llama_memory_seq_pos_max(context.memory, seq) == -1 for seq in range(MAX_SEQUENCES))


@pytest.mark.slow  # the fast tier's exact decoding on llama.cpp is test_backends'
def test_exact_passes_have_the_bits_of_one_token_steps(context):
    """exact: a 70-token chain over 600 cached tokens equals 70 one-token steps (without it, llama.cpp
    attends a lone query over 512+ cells, and 64+ queries, along other paths: logits ~1 apart)."""
    prompt, tokens = list(range(1000, 1600)), list(range(5, 75))
    batch = context.batched(exact=True)
    batch.add(prompt)
    steps = []
    for token in tokens:
        steps.append(batch.verify_trees([DraftTree.chain(token)])[0][0][0])
        batch.commit([[0]])
    batch.release()
    batch.add(prompt)
    chain = batch.verify_trees([DraftTree.chain(tokens[0], tokens[1:])])[0][0]
    batch.release()
    assert torch.equal(chain, torch.stack(steps))


@pytest.fixture(scope="module")
def exact_llamacpp(on_llamacpp, bench_prompts) -> tuple:
    """The llama.cpp model with exact passes, and its plain decoding of two prompts (48 tokens), made once
    for every method below."""
    # llama.cpp's curve with exact passes (a one-token pass padded to two), fixed: measured on a busy
    # machine its extra nodes can look so dear that LogitSpec drafts nothing and the check below is void
    exact = save_fixed_costs(dataclasses.replace(on_llamacpp, exact="on"), LLAMACPP_EXACT_COSTS)
    engine, config = Engine(exact), GenerationConfig(max_new_tokens=48)
    plain = {
        name: engine.generate(bench_prompts[name], parse_method("plain").build(on_llamacpp), config).token_ids
        for name in ("summarization", "math_reasoning")
    }
    return exact, plain


@pytest.mark.slow  # the fast tier's check of exact LogitSpec on llama.cpp is test_backends' (one prompt)
@pytest.mark.parametrize("method", ["logitspec", "pld", "lookahead"])
def test_greedy_methods_equal_plain(exact_llamacpp, bench_prompts, method):
    """exact=on: one-token passes padded, so every pass takes llama.cpp's many-query attention."""
    exact, plain = exact_llamacpp
    engine = Engine(exact)
    for name, expected in plain.items():
        out = engine.generate(bench_prompts[name], parse_method(method).build(exact), GenerationConfig(max_new_tokens=48))
        assert out.token_ids == expected, name
        assert out.stats.mat > 1.0 or method == "lookahead"


def test_batched_rows_decode_to_the_end(on_llamacpp, bench_prompts):
    """Three short prompts (summarization's ~1,000-token prefill cost most of this test's time)."""
    engine = Engine(on_llamacpp)
    prompts = [bench_prompts[name] for name in ("mt_bench", "qa", "translation")]
    config = GenerationConfig(max_new_tokens=24)
    free = len(llamacpp_model(on_llamacpp).free_sequences)
    outputs = generate_batch(engine, prompts, lambda: parse_method("logitspec").build(on_llamacpp), config)
    assert [len(out.token_ids) for out in outputs] == [24, 24, 24] or all(out.token_ids for out in outputs)
    assert len(llamacpp_model(on_llamacpp).free_sequences) == free


def test_measuring_the_cost_curve_gives_its_sequence_back(on_llamacpp, tmp_path):
    """A curve measured while the machine is busy is not cached, so every engine measures again: each
    measurement must hand its sequence (and KV cells) back to the shared context."""
    from specdec.engine import costs

    free = len(llamacpp_model(on_llamacpp).free_sequences)
    for _ in range(2):
        costs.load_or_measure(on_llamacpp, tmp_path, sizes=(1, 2), repeats=1, context_len=16, is_busy=lambda share: True)
    assert len(llamacpp_model(on_llamacpp).free_sequences) == free


def test_feature_methods_are_refused(on_llamacpp, bench_prompts):
    engine = Engine(on_llamacpp)
    with pytest.raises(ValueError, match="hidden states"):
        engine.generate(bench_prompts["qa"], parse_method("eagle").build(on_llamacpp), GenerationConfig(max_new_tokens=4))


def test_bad_backend_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="backend must be one of"):
        load_model("smollm2-135m", dtype="fp32", backend="onnx")


def test_a_model_without_gguf_is_refused(default_model, tmp_path):
    folder = tmp_path / "hf"
    default_model.model.config.save_pretrained(folder)
    tiny = default_model.model.config.__class__(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    )
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(tiny).save_pretrained(folder)
    default_model.tokenizer.save_pretrained(folder)
    with pytest.raises(ModelLoadError, match="GGUF"):
        load_model(str(folder), dtype="fp32", backend="llamacpp")


def test_cli_generates_on_llamacpp(on_llamacpp, capsys):
    """`--backend llamacpp` end to end: the CLI's text equals the library's on the same backend."""
    import json

    from specdec.api import generate
    from specdec.cli import main

    args = ["generate", "Name three colours.", "--chat", "--dtype", "fp32", "--max-new-tokens", "12", "--json"]
    assert main([*args, "--backend", "llamacpp", "--method", "pld"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = generate(on_llamacpp, "Name three colours.", chat=True, max_new_tokens=12)
    assert result["token_ids"] == expected.token_ids and result["text"] == expected.text


@pytest.mark.slow
def test_server_on_llamacpp(on_llamacpp):
    """The server on the llama.cpp backend: a request alone gives the library's text; two concurrent
    ones complete (rows beside each other may round a near tie differently, see specdec.backends.llamacpp);
    a method that reads hidden states gets a 400 naming why, not a 500."""
    from concurrent.futures import ThreadPoolExecutor

    from starlette.testclient import TestClient

    from specdec.api import generate
    from specdec.serve.app import ServerConfig, create_app

    config = ServerConfig(model=ModelSpec(backend="llamacpp"), method="logitspec", max_batch=2, log_level="warning")
    prompts = ["The three primary colors are", "Water boils at"]
    with TestClient(create_app(config, on_llamacpp), raise_server_exceptions=False) as http:
        def complete(prompt: str, specdec: dict | None = None):
            body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, **({"specdec": specdec} if specdec else {})}
            return http.post("/v1/completions", json=body)

        single = complete(prompts[0])
        assert single.status_code == 200, single.text
        alone = generate(on_llamacpp, prompts[0], "plain", max_new_tokens=12)
        assert single.json()["choices"][0]["text"] == alone.text
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(complete, prompts))
        for reply in replies:
            assert reply.status_code == 200, reply.text
            assert 0 < reply.json()["usage"]["completion_tokens"] <= 12
        refused = complete(prompts[0], {"method": "eagle"})
        assert refused.status_code == 400 and "hidden states" in refused.text


@pytest.mark.slow
def test_demo_on_llamacpp(on_llamacpp, capsys):
    """`specdec-hf demo --backend llamacpp --exact on`: every row says the same output as plain; no eagle
    row (llama.cpp returns no hidden states)."""
    from specdec.demo import run_demo

    run_demo(ModelSpec(dtype="fp32", backend="llamacpp", exact="on"), max_new_tokens=24)
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["plain"], ["pld"], ["logitspec"], ["eagle"])]
    assert [row[0] for row in rows] == ["plain", "pld", "logitspec"]
    assert all(row[-1] == "yes" for row in rows)


def test_analyze_refuses_the_backend(tmp_path, capsys):
    """`analyze` reads every position's logits from the transformers model: a one-line error, exit 2."""
    from specdec.cli import main

    assert main(["analyze", "--backend", "llamacpp", "--per-category", "1", "--out", str(tmp_path / "a")]) == 2
    assert "backend 'torch'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()

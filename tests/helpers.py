"""What several test modules share, in one place: test modules import from here (and take fixtures from
conftest.py), never from one another.

- prompts: Spec-Bench prompts of every category and plain decoding's outputs on them, for
  "token-identical to plain" tests (`PlainRuns`; conftest.py holds one for the session, `plain_runs`);
- fixed timings: the cost curve and attention plan the suite seeds its cache with, so no test depends
  on wall-clock timing (`save_fixed_costs` for a model view with a cost key of its own);
- tiny models and trees: random configs of two architectures, draft-tree shapes, a reference forward;
- statistics: the total-variation bound that the distribution tests of every acceptance rule use;
- small shared values: a layer-skip set, a text corpus, tree walks, proposers on fresh tables.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import sysconfig
from pathlib import Path

import torch
from filelock import FileLock
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

# ------------------------------------------------------------------ prompts
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def prompts_by_category(
    tokenizer, subset: Path, categories: tuple[str, ...] = CATEGORIES
) -> dict[str, list[int]]:
    """`category-question_id` -> prompt token ids, the first question of each category in `categories`."""
    questions = [q for q in load_questions(subset, per_category=1) if q.category in categories]
    assert sorted({q.category for q in questions}) == sorted(categories)
    return {
        f"{q.category}-{q.question_id}": encode_prompt(tokenizer, q.turns[0], chat=True) for q in questions
    }


class PlainRuns:
    """Plain decoding's tokens per (prompt, length, sampling), each computed once: what lossless tests compare with.

    shared: a folder the run's pytest-xdist workers all see; an output one worker computed is read
    there by the others (under a file lock, so it is computed once per run, not once per worker). The
    workers run the same engine with the same thread count, so they would compute the same tokens.
    """

    LENGTH = 48  # the longest greedy run the suite asks of most prompts

    def __init__(self, engine: Engine, prompts: dict[str, list[int]], shared: Path | None = None) -> None:
        self.engine, self.prompts, self.shared = engine, prompts, shared
        self.outputs: dict[tuple[str, int, SamplingParams], list[int]] = {}

    def tokens(self, name: str, max_new_tokens: int, sampling: SamplingParams | None = None) -> list[int]:
        """Plain decoding's first `max_new_tokens`. Greedy, that is a prefix of a longer run, so every
        greedy length up to LENGTH shares one run (the seeded ones are asked at one length each)."""
        sampling = sampling or SamplingParams()
        key = (name, max(max_new_tokens, self.LENGTH) if sampling.greedy else max_new_tokens, sampling)
        if key not in self.outputs:
            self.outputs[key] = self._shared(key) if self.shared else self._decode(key)
        return self.outputs[key][:max_new_tokens]

    def _decode(self, key: tuple[str, int, SamplingParams]) -> list[int]:
        name, max_new_tokens, sampling = key
        config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling)
        return self.engine.generate(self.prompts[name], PlainProposer(), config).token_ids

    def _shared(self, key: tuple[str, int, SamplingParams]) -> list[int]:
        digest = hashlib.sha256(repr((key, self.prompts[key[0]])).encode()).hexdigest()[:16]
        path = self.shared / f"plain-{key[0]}-{key[1]}-{digest}.json"
        with FileLock(f"{path}.lock"):
            if not path.exists():
                path.write_text(json.dumps(self._decode(key)))
            return json.loads(path.read_text())


# ------------------------------------------------------------------ fixed timings
# Seconds per forward pass of SmolLM2-135M in fp32 at these tree sizes (2-core AVX-512 machine, idle).
FIXED_COST_CURVE = {1: 0.039, 2: 0.045, 4: 0.05, 8: 0.06, 16: 0.073, 32: 0.105, 64: 0.157}


def fixed_attention_plan():  # noqa: ANN201 - specdec.backends.torch.attention.AttentionPlan
    """SDPA for short contexts, eager beyond: both implementations run in the suite, chosen by shape."""
    from specdec.backends.torch import attention

    return attention.AttentionPlan((128, 512), (1, 64), (("sdpa", "sdpa"), ("eager", "sdpa")))


def save_fixed_costs(loaded, curve: dict[int, float] = FIXED_COST_CURVE):  # noqa: ANN001, ANN201 - LoadedModel
    """Seed the cost cache of `loaded`'s key (its backend, weights and dtype) with `curve`, so its trees
    are sized the same on a busy machine as on an idle one (no timing, no compiling); returns `loaded`."""
    from specdec.backends.timing_cache import cost_key
    from specdec.engine import costs

    key = cost_key(loaded, costs.DEFAULT_SIZES, costs.DEFAULT_CONTEXT)
    curve = costs.CostModel(tuple(curve), tuple(curve.values()))
    costs.save_costs(costs.costs_folder(), key, curve)
    return loaded


def on_meta(head: torch.nn.Module) -> torch.nn.Module:
    """A copy of a head on the meta device (shapes, no values: any read of a value fails), with a meta stand-in
    for the target's embedding it borrows (kept in a list, not a submodule, so not copied)."""
    borrowed = head.embed[0]
    meta = copy.deepcopy(head, {id(borrowed): borrowed}).to("meta")
    meta.embed = [torch.nn.Embedding(*borrowed.weight.shape, device="meta")]
    return meta


# ------------------------------------------------------------------ tiny models and trees
ATOL = 1e-4


def assert_logits_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to fp32 rounding, which grows with the logits' scale (the default model's reach ~30).

    Different kernel shapes (a cache that grew, a tree against a fresh prefill) sum in a different
    order; that moved the default model's logits by up to 2e-4 on one CI machine, 4e-5 on another.
    A wrong mask or position moves them by whole units.
    """
    atol = ATOL + 2e-5 * float(expected.abs().max())
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=0)


def tiny_llama() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def tiny_qwen2(sliding: bool = False, heads_of_64: bool = False) -> torch.nn.Module:
    """heads_of_64: two query heads and one key head of 64 (specdec's attention kernel's size) instead of 4 and
    2 of 16."""
    sizes = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if heads_of_64:
        sizes = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)
    config = Qwen2Config(
        vocab_size=512, num_hidden_layers=2, max_position_embeddings=512,
        use_sliding_window=sliding, sliding_window=16, max_window_layers=0, **sizes,
    )  # fmt: skip
    torch.manual_seed(1)
    return Qwen2ForCausalLM(config).eval()


TEXTS = [  # short chats of several kinds: what the trained-head tests learn from
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Speculative decoding drafts several tokens and verifies them in one pass of the target model.",
    "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of Italy.",
    "To make tea, boil water, pour it over the leaves, wait three minutes and strain.",
    "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.",
]
# Training settings small enough for a test: a few steps over TEXTS on the tiny target.
TRAIN = dict(draft_vocab=256, max_len=64, tokens_per_batch=512, lr=1e-2, epochs=3.0, checkpoint_every=4, holdout=0.1)


def tiny_target(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A 6-layer Llama over a real tokenizer's vocabulary: a target trained heads can learn quickly."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def random_tree(num_nodes: int, vocab: int, seed: int, max_fanout_bias: float = 0.5) -> DraftTree:
    """A random tree: each node's parent is drawn among earlier nodes."""
    gen = torch.Generator().manual_seed(seed)
    parents = [-1]
    for i in range(1, num_nodes):
        # Bias towards recent nodes for depth, or towards the root for width.
        if torch.rand(1, generator=gen).item() < max_fanout_bias:
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
        else:
            parents.append(i - 1)
    tokens = torch.randint(0, vocab, (num_nodes,), generator=gen)
    return DraftTree(tokens, torch.tensor(parents, dtype=torch.int64))


def trees(vocab: int) -> dict[str, DraftTree]:
    return {
        "root-only": DraftTree.chain(5),
        "chain": DraftTree.chain(7, [11, 13, 17, 19, 23, 29]),
        "wide": DraftTree(
            torch.randint(0, vocab, (9,), generator=torch.Generator().manual_seed(2)),
            torch.tensor([-1] + [0] * 8),
        ),
        "deep": random_tree(24, vocab, seed=3, max_fanout_bias=0.15),
        "bushy": random_tree(32, vocab, seed=4, max_fanout_bias=0.7),
    }


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1]


def has_path(tree: DraftTree, branch: list[int]) -> bool:
    node = 0
    for token in branch:
        node = next((c for c in tree.children[node] if tree.token_list[c] == token), -1)
        if node < 0:
            return False
    return True


def walk(tree: DraftTree, truth: list[int]) -> list[int]:
    """The accepted path of greedy verification when the target's tokens are `truth`."""
    path = [0]
    for token in truth:
        node = next((c for c in tree.children[path[-1]] if tree.token_list[c] == token), -1)
        if node < 0:
            break
        path.append(node)
    return path


# ------------------------------------------------------------------ statistics
DELTA = 1e-6  # a correct acceptance rule fails a distribution test for fewer than one seed in a million


def tv_bound(true_probs: torch.Tensor, num_trials: int, delta: float = DELTA) -> float:
    """Largest total variation a *correct* rule shows, except with probability delta.

    For n i.i.d. trials, the empirical frequency of outcome k has variance
    p_k (1 - p_k) / n, so E|freq_k - p_k| <= sqrt(p_k (1 - p_k) / n) (Jensen) and
        E[TV] <= 1/2 * sum_k sqrt(p_k (1 - p_k) / n)        (<= 1/2 sqrt(K / n) for K outcomes).
    Changing one trial moves TV by at most 1/n, so by McDiarmid's inequality
        P(TV >= E[TV] + t) <= exp(-2 n t^2),  t = sqrt(ln(1 / delta) / (2 n)).
    With n = 100k and 8 uniform outcomes this is about 0.004 + 0.008; with 64, about
    0.013 + 0.008 (skewed outcomes give less: the bound uses the true p_k). A correct
    rule shows TV ~ E[TV]; broken rules show 0.1 to 0.5. The seeds are fixed, so every
    run is the same run; the bound says the seeds were not picked to pass.
    """
    spread = 0.5 * float((true_probs * (1 - true_probs)).clamp(min=0).sqrt().sum()) / math.sqrt(num_trials)
    return spread + math.sqrt(math.log(1 / delta) / (2 * num_trials))


def total_variation(samples: torch.Tensor, true_probs: torch.Tensor) -> float:
    """samples: [n] int64 outcome ids; true_probs: [K] float64."""
    freq = torch.bincount(samples, minlength=true_probs.numel()).double() / samples.numel()
    return 0.5 * float((freq - true_probs.flatten()).abs().sum())


# ------------------------------------------------------------------ shared values and proposers
SKIP = "4,6,8,10,12,14,16,18,20,22"  # layers a layer-skip draft of the default model leaves out
STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS = [STDLIB / name for name in ("textwrap.py", "string.py", "shlex.py", "fnmatch.py")]  # a datastore's text
# Seconds per pass at 1, 16, 32, 64 nodes: the costs unit tests of the retrieval proposers size trees by.
CPU_COSTS_CURVE = ((1, 16, 32, 64), (0.052, 0.094, 0.127, 0.189))


def fresh_logitspec(default_model, method: str):  # noqa: ANN001, ANN201 - LoadedModel, LogitSpecProposer
    """LogitSpec on a new recycle table and session store (not the model's shared ones): no test order effects."""
    from specdec.engine.costs import CostModel
    from specdec.proposers import parse_method
    from specdec.proposers.logitspec.proposer import LogitSpecProposer
    from specdec.proposers.logitspec.sources import Sources
    from specdec.proposers.recycle import RecycleTable, output_vocab_size
    from specdec.proposers.session_store import SessionStore

    config = parse_method(method)
    vocab = output_vocab_size(default_model.model)
    sources = Sources(
        RecycleTable(vocab, 8) if config.recycle else None,
        SessionStore(10_000, 4) if config.session else None,
        config.open_datastore(default_model),
    )
    return LogitSpecProposer(config, CostModel(*CPU_COSTS_CURVE), default_model.eos_token_ids, sources)


def fresh_recycle(default_model, config):  # noqa: ANN001, ANN201 - LoadedModel, RecycleConfig -> RecycleProposer
    """A proposer on a new, empty table (not the model's shared one), so tests do not depend on order."""
    from specdec.proposers.recycle import RecycleProposer, RecycleTable, output_vocab_size

    table = RecycleTable(output_vocab_size(default_model.model), config.k)
    return RecycleProposer(config, table, default_model.eos_token_ids)


def assert_resume_is_exact(tiny, data_file, out, steps: int, tmp_path, options: dict) -> None:  # noqa: ANN001
    """Stopped after 7 steps and resumed on the same cache, a run ends with the heads in `out` bit for bit
    (the trained-head tests: Medusa's and Hydra's)."""
    from safetensors.torch import load_file

    from specdec.drafters.train import TrainConfig, train

    cache = str(out / "features")
    train(tiny, TrainConfig(str(data_file), str(tmp_path), max_steps=7, cache=cache, **options), log=lambda _: None)
    train(tiny, TrainConfig(str(data_file), str(tmp_path), resume=True, cache=cache, **options), log=lambda _: None)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == steps > 7
    a, b = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


# ------------------------------------------------------------------ the block kernels' bounds
U_FP32, U_BF16 = 2.0**-24, 2.0**-8  # unit roundoffs


def forced_paths() -> list[str]:
    """Every C++ path of the block kernels (`specdec.kernels.q4_kernel`) this CPU runs, the automatic
    one first."""
    from specdec.kernels import q4_kernel

    best = torch.ops.specdec_q4.q4_linear_path()
    return [path for path in q4_kernel.PATHS if q4_kernel.PATHS.index(path) >= q4_kernel.PATHS.index(best)]


def summation_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per element, the most two fp32 sums of the same K products can differ by, in any order.

    Both sides multiply bf16 by bf16, exact in fp32 (8-bit by 8-bit significands), so they differ only
    in the order of the K - 1 additions; any order's error is at most gamma_{K-1} * sum |x_k w_k| with
    gamma_n = n u / (1 - n u), u = 2^-24 (Higham, ch. 4: recursive, pairwise and blocked sums alike).
    Two such sums differ by at most twice that: 2 * K * u * sum |x_k w_k| (1.8e-4 of it for K = 1536).
    """
    cols = x.shape[-1]
    gamma = cols * U_FP32 / (1 - cols * U_FP32)
    return 2 * gamma * (x.to(torch.bfloat16).float().abs() @ weight.float().abs().T)


def assert_within_bound(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """y = the kernel's x @ weight.T (weight: the kernel's dequantized one), within the bound of the reference."""
    reference = x.to(torch.bfloat16).float() @ weight.float().T  # the references' product, in fp32
    bound = summation_bound(x, weight)
    if y.dtype == torch.bfloat16:  # plus the output's own rounding to bf16 (nearest: u = 2^-8)
        bound = bound + U_BF16 * (reference.abs() + bound)
    excess = (y.float() - reference).abs() - bound
    assert excess.max() <= 0, f"error exceeds the bound by {excess.max():.3g}"


def assert_i8_within_bound(y: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                           minimum: torch.Tensor) -> None:
    """y = the 8-bit-activation kernel's product (`specdec.kernels.q4_i8`) of x and W (q [N, K], fp32
    scale and minimum [N, K/32], or [N, K/16] a scale per 16), within the bound of the float64 reference.

    The kernel's integer sums are exact; per block it rounds scale * d once and adds two terms by FMA to
    an fp32 sum, 2 K/32 roundings of a running sum in all: at most gamma_{2 K/32 + 1} times the sum of the
    terms' magnitudes (Higham, ch. 3-4), plus the output's own rounding to bf16.
    """
    from specdec.kernels import q4_i8

    reference = q4_i8.reference_linear(x, q, scale, minimum)
    dots, d, s = q4_i8.block_dots(x, q, scale.shape[1])
    terms = (dots.abs() * (scale.double().abs()[None] * d.double()[:, None])
             + minimum.double().abs()[None] * s.double().abs()[:, None]).sum(-1)
    steps = 2 * scale.shape[1] + 1
    bound = steps * U_FP32 / (1 - steps * U_FP32) * terms
    if y.dtype == torch.bfloat16:
        bound = bound + U_BF16 * (reference.abs() + bound)
    excess = (y.double() - reference).abs() - bound
    assert excess.max() <= 0, f"error exceeds the bound by {excess.max():.3g}"


# The C++ kernels' tests skip on a CPU without AVX-512 BF16 (or where the extension cannot build):
# such a run passes without testing a kernel, so conftest's summary says so in the log.
KERNEL_TEST_FILES = frozenset({
    "test_q4_kernel.py", "test_q8_kernel.py", "test_q4_i8.py", "test_q6_k.py", "test_fused.py",
    "test_tree_attention.py", "test_invariant.py", "test_draft_fused.py", "test_gguf_blocks.py",
})  # fmt: skip


def kernel_test_outcomes(reports: dict[str, list]) -> tuple[int, int, set[str]]:
    """(passed, skipped, skip reasons) of the kernel files' tests, from the terminal reporter's stats."""
    def in_kernel_files(report) -> bool:
        return Path(report.nodeid.split("::")[0]).name in KERNEL_TEST_FILES

    passed = sum(in_kernel_files(r) for r in reports.get("passed", []) if r.when == "call")
    skipped = [r for r in reports.get("skipped", []) if in_kernel_files(r)]
    reasons = {str(r.longrepr[-1]) if isinstance(r.longrepr, tuple) else str(r.longrepr) for r in skipped}
    return passed, len(skipped), reasons


def build_proposer(loaded, method: str, request):  # noqa: ANN001, ANN201 - LoadedModel, FixtureRequest, Proposer
    """`method` built on `loaded`, and three that need more than a method string: `datastore` (over
    `CORPUS`), `layerskip` (skipping `SKIP`) and `draft:self` (the model drafting for itself, k = 3)."""
    from specdec.proposers import parse_method
    from specdec.proposers.draft import DraftConfig
    from specdec.proposers.layerskip import LayerSkipConfig

    if method == "datastore":
        from specdec.datastore_build import build_datastore

        folder = request.getfixturevalue("tmp_path_factory").mktemp("ds") / "stdlib"
        return parse_method(f"datastore:path={build_datastore(CORPUS, loaded.tokenizer, folder).out_dir}").build(loaded)
    if method == "layerskip":
        return LayerSkipConfig(skip=SKIP, k=3, adaptive=False).build(loaded)
    if method == "draft:self":
        return DraftConfig("self", quantize="none", k=3, adaptive=False).build_with(loaded, loaded.model)
    return parse_method(method).build(loaded)


def write_gguf(path: Path, tensors: dict, architecture: str = "qwen2") -> None:
    """A GGUF of just `tensors` (name -> (bytes or values, gguf.GGMLQuantizationType)): what the block
    readers see of a file, without the metadata a model load needs."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    for name, (raw, kind) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_policy(state, steps: int, drafted_tokens: int, drafted_s: float) -> list[bool]:  # noqa: ANN001 - a FloorState
    """The modes a floor's `state` picks over `steps` steps: a drafting step emits `drafted_tokens` in
    `drafted_s`, a plain step one token in 1 s (a fixed price: nothing depends on the machine's load)."""
    modes = []
    for _ in range(steps):
        drafting = state.drafts()
        modes.append(drafting)
        state.observe(drafting, drafted_tokens if drafting else 1, drafted_s if drafting else 1.0)
    return modes

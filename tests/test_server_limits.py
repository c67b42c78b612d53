"""What one client may cost the others on a shared `specdec serve`: time, context, learned state, statistics.

What must hold (each test can fail):
- a prompt plus max_tokens beyond the model's context gets 400 in OpenAI's
  shape with code context_length_exceeded (never a silently cut reply);
- without --expose-stats a reply's `specdec` field names the method and its
  options only: no acceptance statistics, timings or queue time;
- two API keys never share the session store: what one key's requests put in
  it, the other key's proposers cannot draft from;
- the prefill chunk is sized from the cost curve: the largest whose pass costs at
  most 2 one-token passes (a running stream's gap at most 3x), the default 256
  where passes cost the same at any width;
- (slow) a running stream's largest gap while a 3,000-token prompt joins the
  batch stays within what one prefill chunk can cost (a ratio to its normal
  gap), where the whole prompt in one piece would freeze it far longer;
- (slow, real process) clients that trickle or never finish their headers or
  body get 408 within the request timeout and their connections are closed,
  while the server keeps serving; SIGTERM then ends the process with status 0.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from helpers import FIXED_COST_CURVE, save_fixed_costs
from starlette.testclient import TestClient

from specdec.engine.costs import CostModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import DEFAULT_PREFILL_CHUNK
from specdec.proposers import make_config
from specdec.serve.app import ServerConfig, create_app
from specdec.serve.metrics import ServerMetrics
from specdec.serve.prefill import MAX_GAP_RATIO, MIN_PREFILL_CHUNK, sized_prefill_chunk
from specdec.serve.process import ServerProcess
from specdec.serve.scheduler import DoneEvent, Job, Scheduler, TextEvent

KEYS = ("key-of-alice", "key-of-bob")
SERVER = ServerConfig(method="session", api_keys=KEYS, max_tokens_limit=256, log_level="warning")
SECRET = "The vault code for the north tower is seven nine three one and the guard changes at midnight."
WAIT_S = 600.0


@pytest.fixture(scope="module")
def http(default_model) -> Iterator[TestClient]:
    # the suite's fixed curve under the key this process has now (an earlier test may have changed the
    # thread count the key holds; a curve measured under the suite's load would size the chunk)
    save_fixed_costs(default_model)
    with TestClient(create_app(SERVER, default_model), raise_server_exceptions=False) as client:
        yield client


def complete(http: TestClient, key: str, **body):
    payload = {"prompt": "Say hello.", "max_tokens": 4, "temperature": 0, **body}
    return http.post("/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"})


def test_prompt_plus_max_tokens_beyond_the_context_gets_400(http, default_model):
    context = default_model.model.config.max_position_embeddings
    prompt = [42] * (context - 50)
    response = complete(http, KEYS[0], prompt=prompt, max_tokens=100)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert error["type"] == "invalid_request_error" and str(context) in error["message"]
    one_over = complete(http, KEYS[0], prompt=prompt, max_tokens=51)  # context + 1 tokens in all
    assert one_over.json()["error"]["code"] == "context_length_exceeded"


def test_stats_are_hidden_without_the_flag(http):
    reply = complete(http, KEYS[0])
    assert reply.status_code == 200, reply.text
    assert set(reply.json()["specdec"]) == {"method", "options"}
    assert reply.json()["specdec"]["method"] == "session"


def test_two_api_keys_do_not_share_the_session_store(http, default_model):
    tokenizer = default_model.tokenizer
    assert complete(http, KEYS[0], prompt=SECRET, max_tokens=2).status_code == 200
    assert complete(http, KEYS[1], prompt="Name a fruit.", max_tokens=2).status_code == 200
    pool = http.app.state.service.pool
    config = make_config("session", {})
    stores = []
    for scope in ("key0", "key1"):
        proposer = pool.acquire(config, scope)
        stores.append(proposer.store)
        pool.release(proposer)
    alice, bob = stores
    assert alice is not bob
    prefix = tokenizer.encode(SECRET.split(" is ")[0] + " is", add_special_tokens=False)
    assert alice.lookup(prefix, 4)  # the control: the key that sent it drafts from it
    assert bob.lookup(prefix, 4) == []  # the other key never sees it
    assert alice.num_tokens > 0 and bob.num_tokens > 0


# ------------------------------------------------------------------ a long prompt joining a running stream
@pytest.mark.slow
def test_a_long_prompt_stalls_a_running_stream_for_one_chunk_at_most(engine, default_model):
    chunk, normal_steps = 32, 8
    scheduler = Scheduler(engine, 4, ServerMetrics(), max_batch=2, prefill_chunk=chunk)
    scheduler.start()
    times: list[float] = []
    done = {name: threading.Event() for name in ("stream", "long")}
    joined_at: list[float] = []

    def sink_for(name: str):
        def sink(event) -> None:
            if name == "stream" and isinstance(event, TextEvent):
                times.append(time.perf_counter())
            if isinstance(event, DoneEvent) or not isinstance(event, TextEvent):
                if name == "long":
                    joined_at.append(time.perf_counter())
                done[name].set()

        return sink

    plain = make_config("plain", {})
    counting = default_model.tokenizer.encode("1, 2, 3, 4, 5, 6, 7, 8,", add_special_tokens=False)
    long = (counting * (3000 // len(counting) + 1))[:3000]
    stream = Job(counting, plain, "plain", GenerationConfig(max_new_tokens=2000), "completions", True,
                 sink_for("stream"))  # fmt: skip
    try:
        scheduler.submit(stream)
        while len(times) < normal_steps + 1:
            assert not done["stream"].is_set()
            time.sleep(0.05)
        submitted = time.perf_counter()
        scheduler.submit(Job(long, plain, "plain", GenerationConfig(max_new_tokens=1), "completions", False,
                             sink_for("long")))  # fmt: skip
        assert done["long"].wait(WAIT_S), "the long prompt never finished"
        assert not done["stream"].is_set(), "the stream ended before the long prompt joined: make it longer"
    finally:
        scheduler.close(60)
    normal = statistics.median(b - a for a, b in zip(times[:normal_steps], times[1 : normal_steps + 1], strict=True))
    during = [t for t in times if submitted <= t <= joined_at[0]]
    gaps = [b - a for a, b in zip([submitted, *during], [*during, joined_at[0]], strict=True)]
    # A pass over T tokens costs at most T one-token passes (on a CPU far less: the weights are read once),
    # so a step that prefills one chunk and decodes the stream costs at most chunk + 1 normal steps.
    assert max(gaps) <= (chunk + 1) * normal, (max(gaps), normal, gaps.index(max(gaps)), len(gaps))
    assert len(during) >= 3000 // chunk - 1  # the stream kept emitting through the whole prefill


# ------------------------------------------------------------------ slow and lying clients (a real process)
REQUEST_TIMEOUT_S = 3.0
SLACK_S = 15.0  # scheduling slack on a loaded machine; the point is "bounded", not "fast"
RESET = b"(connection reset)"
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"


def _read_reply(sock: socket.socket, deadline: float) -> bytes:
    """Everything the server sends until it closes the connection (or the deadline passes)."""
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            piece = sock.recv(4096)
        except TimeoutError:
            break
        except ConnectionResetError:  # a byte sent as the server closed: TCP resets, maybe before the read
            return data or RESET
        if not piece:
            return data
        data += piece
    raise AssertionError(f"the connection stayed open past the deadline; got {data[:200]!r}")


def _slow_client(url: str, kind: str, results: dict, name: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    deadline = start + REQUEST_TIMEOUT_S * 2 + SLACK_S  # headers' deadline, then the body's
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        if kind == "headers":  # headers never finish: a byte now and then
            sock.sendall(HEAD)
            _trickle(sock, b"X-Slow: " + b"a" * 200, deadline)
        elif kind == "lying":  # declares 100 bytes, sends 10, waits
            sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"prompt":')
        else:  # the body trickled a byte at a time
            sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n")
            _trickle(sock, b'{"prompt": "' + b"a" * 80, deadline)
        results[name] = (_read_reply(sock, deadline), time.monotonic() - start)


def _trickle(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Send `data` a byte every half second until the server answers or closes (or the deadline)."""
    for byte in data:
        if time.monotonic() > deadline:
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(0.5)
        if _closed(sock):
            return


def _closed(sock: socket.socket) -> bool:
    """True when the server has answered or closed (data or EOF waiting), without consuming it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # data (the 408) or b"" (closed): either way the server is done
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


@pytest.mark.slow
def test_slow_and_lying_clients_get_408_and_the_server_keeps_serving(default_model, tmp_path):
    args = ["--dtype", "fp32", "--method", "plain", "--log-level", "warning",
            "--request-timeout", str(REQUEST_TIMEOUT_S), "--shutdown-timeout", "10"]  # fmt: skip
    server = ServerProcess(args, tmp_path / "server.log").start()
    try:
        server.wait_ready()
        results: dict = {}
        clients = [
            threading.Thread(target=_slow_client, args=(server.url, kind, results, f"{kind}{i}"))
            for kind in ("headers", "lying", "trickle")
            for i in range(5)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(REQUEST_TIMEOUT_S * 2 + SLACK_S + 30)
        assert len(results) == len(clients), sorted(results)
        for name, (reply, elapsed) in results.items():
            limit = REQUEST_TIMEOUT_S * (2 if name.startswith("trickle") else 1) + SLACK_S
            assert elapsed <= limit, (name, elapsed)
            if reply == RESET and not name.startswith("lying"):  # closed while it was still sending
                continue
            assert reply.startswith(b"HTTP/1.1 408"), (name, reply[:200])
            assert b"request_timeout" in reply, (name, reply)
        assert sum(reply != RESET for reply, _ in results.values()) >= len(results) // 2
        served = httpx.post(server.url + "/v1/completions", timeout=120,
                            json={"prompt": "Say hello.", "max_tokens": 3, "temperature": 0})  # fmt: skip
        assert served.status_code == 200, served.text
        assert server.health() is not None
    finally:
        status = server.stop()
    assert status == 0, server.log_tail()  # a clean SIGTERM shutdown is not "killed" (143)
    assert "Traceback" not in server.log_tail()


# ------------------------------------------------------------------ the prefill chunk, from the cost curve
def test_the_prefill_chunk_is_sized_so_a_joining_prompt_costs_a_stream_at_most_3x_its_gap(http):
    """With the suite's fixed curve (`helpers.FIXED_COST_CURVE`), 256 tokens cost ~0.55 s by the curve,
    ~14 one-token passes: a stream's gap stretched ~15x. The 3x bound would allow ~18 tokens, below the
    floor of MIN_PREFILL_CHUNK (a smaller chunk's pass is mostly the weights' read): the floor's size.
    Where passes are cheap, the bound picks the largest chunk that fits it."""
    curve = CostModel(tuple(FIXED_COST_CURVE), tuple(FIXED_COST_CURVE.values()))
    chunk = sized_prefill_chunk(curve)
    assert (curve.cost(MIN_PREFILL_CHUNK) + curve.cost(1)) / curve.cost(1) > MAX_GAP_RATIO
    assert chunk == MIN_PREFILL_CHUNK
    cheap = CostModel((1, 64, 256), (0.04, 0.05, 0.2))  # 0.08 s allows 64 + (0.08 - 0.05) / 0.15 * 192 tokens
    wide = sized_prefill_chunk(cheap)
    assert (cheap.cost(wide) + cheap.cost(1)) / cheap.cost(1) <= MAX_GAP_RATIO
    assert (cheap.cost(wide + 1) + cheap.cost(1)) / cheap.cost(1) > MAX_GAP_RATIO  # the largest that fits
    assert MIN_PREFILL_CHUNK < wide < DEFAULT_PREFILL_CHUNK
    flat = CostModel((1, 64), (0.05, 0.05))  # a pass costs the same at any width: the engine's default
    assert sized_prefill_chunk(flat) == sized_prefill_chunk(None) == DEFAULT_PREFILL_CHUNK
    assert http.app.state.service.prefill_chunk == chunk  # the server sizes it (the suite's curve is cached)

"""SIGTERM drains a real `specdec serve` process: running work ends in OpenAI's shape, the exit is clean.

What must hold (each test can fail), against a child process on loopback:
- requests still running when --shutdown-timeout runs out end cleanly: a
  non-streaming one gets a JSON 503 with code `shutting_down` and `Retry-After`,
  a stream gets a final error event with that code, then `data: [DONE]`;
- the log holds no traceback, and the process exits with status 0;
- in process: a drain refuses new jobs at once, lets the accepted ones (running
  and queued) go on, and after its timeout cancels what is left.
"""

from __future__ import annotations

import json
import threading
from contextlib import ExitStack

import httpx
import pytest

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.proposers import make_config
from specdec.sampling import SamplingParams
from specdec.serve.metrics import ServerMetrics
from specdec.serve.process import ServerProcess
from specdec.serve.scheduler import CancelledEvent, DoneEvent, Job, QueueClosed, Scheduler
from specdec.serve.shutdown import Drain

LIMIT = 1024
SHUTDOWN_S = 2
ARGS = ["--dtype", "fp32", "--method", "plain", "--log-level", "info", "--max-tokens-limit", str(LIMIT),
        "--shutdown-timeout", str(SHUTDOWN_S)]  # fmt: skip
# greedy SmolLM2 counts on for hundreds of tokens: both requests are still running after SHUTDOWN_S
LONG = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": LIMIT, "temperature": 0}
WAIT_S = 120.0


def wait_running(server: ServerProcess, count: int) -> None:
    for _ in range(int(WAIT_S / 0.1)):
        health = server.health()
        if health is not None and health["running"] == count:
            return
        threading.Event().wait(0.1)
    pytest.fail(f"{count} requests never ran together")


@pytest.mark.slow
def test_sigterm_ends_what_outlives_the_timeout_in_openai_shape(default_model, tmp_path):
    server = ServerProcess(ARGS, tmp_path / "server.log").start()
    replies: dict[str, httpx.Response] = {}
    try:
        server.wait_ready()
        with ExitStack() as stack:
            http = stack.enter_context(httpx.Client(base_url=server.url, timeout=WAIT_S))
            stream = stack.enter_context(http.stream("POST", "/v1/completions", json={**LONG, "stream": True}))
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # the stream runs
            waiter = threading.Thread(target=lambda: replies.update(full=http.post("/v1/completions", json=LONG)))
            waiter.start()
            wait_running(server, 2)
            server.terminate()
            events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
            waiter.join(WAIT_S)
        status = server.process.wait(WAIT_S)
    finally:
        server.stop()
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    full = replies["full"]
    assert full.status_code == 503 and full.headers["content-type"] == "application/json", full.text
    assert full.json()["error"]["code"] == "shutting_down" and int(full.headers["retry-after"]) >= 1
    assert status == 0
    assert "Traceback" not in server.log_tail() and "CancelledError" not in server.log_tail()


def test_a_drain_refuses_new_jobs_lets_accepted_ones_run_then_cancels_them(default_model):
    ends: dict[int, object] = {}
    done = threading.Event()

    def job(index: int, max_tokens: int) -> Job:
        def sink(event) -> None:
            if isinstance(event, DoneEvent | CancelledEvent):
                ends[index] = event
            if len(ends) == 2:
                done.set()

        settings = GenerationConfig(max_new_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
        return Job([1, 2, 3], make_config("plain"), "plain", settings, "completions", False, sink)

    scheduler = Scheduler(Engine(default_model), max_queue=4, metrics=ServerMetrics())  # one row at a time
    scheduler.submit(job(0, 2))
    scheduler.submit(job(1, LIMIT))  # queued behind the first; still running when the drain times out
    drain = Drain(scheduler, timeout_s=1.0)
    drain.start()
    with pytest.raises(QueueClosed):
        scheduler.submit(job(2, 2))
    scheduler.start()
    try:
        assert done.wait(WAIT_S)
        drain.join(WAIT_S)
    finally:
        scheduler.close(WAIT_S)
    assert isinstance(ends[0], DoneEvent) and isinstance(ends[1], CancelledEvent)

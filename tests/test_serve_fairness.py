"""Fair sharing between API keys: a flood from one key delays another's request by at most its share.

What must hold (each test can fail; the decode worker is held by an event, never by time):
- admission is round-robin across keys: with one key's backlog waiting, another
  key's later request gets the next free row;
- one key may queue only its share (default: an equal share of --max-queue
  among the keys): its next request gets 429 with `Retry-After`, while another
  key's request is still accepted and served;
- a key holds at most --max-rows-per-key of the batch rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.proposers import make_config
from specdec.sampling import SamplingParams
from specdec.serve.app import ServerConfig, create_app
from specdec.serve.fair import FairQueue
from specdec.serve.metrics import ServerMetrics
from specdec.serve.scheduler import DoneEvent, Job, QueueFull, Scheduler, TextEvent

KEYS = ("key-of-k1", "key-of-k2")
WAIT_S = 120.0
SERVER = ServerConfig(api_keys=KEYS, max_queue=4, max_batch=1, max_tokens_limit=16, log_level="warning")


def ignore(event) -> None:
    pass


def job(scope: str, sink: Callable, max_tokens: int = 2) -> Job:
    settings = GenerationConfig(max_new_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
    return Job([1, 2, 3], make_config("plain"), "plain", settings, "completions", True, sink, scope)


class Holder:
    """A job whose first text piece holds the decode worker until `release`."""

    def __init__(self, scope: str) -> None:
        self.holding, self.released = threading.Event(), threading.Event()
        self.job = job(scope, self.sink)

    def sink(self, event) -> None:
        if isinstance(event, TextEvent):
            self.holding.set()
            self.released.wait(WAIT_S)

    def run(self, scheduler: Scheduler) -> None:
        scheduler.submit(self.job)
        assert self.holding.wait(WAIT_S)


def test_admission_is_round_robin_across_keys(default_model):
    order: list[str] = []
    done = threading.Event()

    def recorder(name: str) -> Callable:
        def sink(event) -> None:
            if isinstance(event, DoneEvent):
                order.append(name)
                if len(order) == 5:
                    done.set()

        return sink

    scheduler = Scheduler(Engine(default_model), max_queue=8, metrics=ServerMetrics())  # one row
    holder = Holder("key0")
    scheduler.start()
    try:
        holder.run(scheduler)
        for index in range(3):
            scheduler.submit(job("key0", recorder(f"k1-{index}")))
        scheduler.submit(job("key1", recorder("k2")))
        scheduler.submit(job("key0", recorder("k1-3")))
        holder.released.set()
        assert done.wait(WAIT_S)
    finally:
        holder.released.set()
        scheduler.close(WAIT_S)
    assert order == ["k2", "k1-0", "k1-1", "k1-2", "k1-3"]  # FIFO would serve k2 fourth


def test_a_key_holds_at_most_its_rows_and_its_share_of_the_queue():
    queue = FairQueue(max_queue=6, max_queue_per_key=2, max_rows_per_key=1)
    jobs = [job(scope, ignore) for scope in ("key0", "key0", "key0", "key1")]
    for one in jobs[:3]:  # two waiting, plus one it could start at once
        queue.push(one, {}, free_rows=2)
    with pytest.raises(QueueFull, match="share"):
        queue.push(job("key0", ignore), {}, free_rows=2)
    queue.push(jobs[3], {}, free_rows=2)
    assert queue.take(2, {}) == [jobs[0], jobs[3]]  # one row each, not both to key0
    assert queue.take(2, {"key0": 1}) == []  # key0 holds its one row
    assert queue.take(2, {}) == [jobs[1]] and len(queue) == 1


@pytest.fixture(scope="module")
def http(default_model) -> Iterator[TestClient]:
    with TestClient(create_app(SERVER, default_model), raise_server_exceptions=False) as client:
        yield client


def complete(http: TestClient, key: str):
    body = {"prompt": "Say hello.", "max_tokens": 2, "temperature": 0, "specdec": {"method": "plain"}}
    return http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def test_a_flood_of_one_key_leaves_room_for_another(http):
    scheduler = http.app.state.service.scheduler
    holder = Holder("key0")
    flood: list[Job] = []
    replies: dict[str, object] = {}
    k2 = threading.Thread(target=lambda: replies.update(k2=complete(http, KEYS[1])))
    try:
        holder.run(scheduler)
        for _ in range(SERVER.max_queue):  # k1 queues until refused: its share is half the queue
            try:
                scheduler.submit(one := job("key0", ignore))
            except QueueFull:
                break
            flood.append(one)
        replies["k1"] = complete(http, KEYS[0])
        k2.start()
        for _ in range(int(WAIT_S / 0.05)):
            if scheduler.num_waiting == len(flood) + 1:
                break
            threading.Event().wait(0.05)
        assert scheduler.num_waiting == len(flood) + 1  # k2's request waits: it was not refused
    finally:
        holder.released.set()
        k2.join(WAIT_S)
    assert len(flood) == 2
    refused = replies["k1"]
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    assert replies["k2"].status_code == 200, replies["k2"].text

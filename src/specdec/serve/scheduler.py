"""One decode loop at a time: a bounded FIFO queue of generation jobs and the worker thread that runs them.

Why: the engine holds the KV cache of one sequence, and on a CPU two interleaved
decode loops are no faster than two in a row. So requests wait in a FIFO queue
and a single worker thread runs them in order, off the event loop, which stays
free to accept, validate and stream requests and to answer /health and /metrics.

Invariants:
- jobs start in submission order; at most `max_queue` jobs wait (the running one
  not counted); a submit beyond that raises `QueueFull` and changes nothing;
- a job's events go only to that job's own `sink`: zero or more `TextEvent`s
  (only when it streams), then exactly one `DoneEvent`, `ErrorEvent` or
  `CancelledEvent`;
- the worker gets each job's proposer from `proposer_for(config)` (the server's
  `ProposerPool`: built once per config, reused) and is its only user while the
  job runs; `begin(prompt_ids)` resets its per-request state, so no token one
  request drafted or saw can reach another;
- a cancelled job never starts, or stops at its next text piece: the engine's
  `on_text` callback raises, which ends `Engine.generate` (the next generation
  starts from a fresh prefill);
- the worker never dies on a job's error; `close()` refuses new jobs, cancels the
  waiting and the running ones, and joins the worker within a bounded time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.engine import Engine, GenerationConfig, GenerationOutput
from specdec.serve.metrics import ServerMetrics

log = logging.getLogger("specdec.server")


class QueueFull(Exception):
    """The queue holds max_queue waiting jobs already."""


class QueueClosed(Exception):
    """The server is shutting down and takes no new jobs."""


class _Cancelled(Exception):
    """Raised from on_text to end a cancelled generation."""


@dataclass(frozen=True)
class TextEvent:
    text: str


@dataclass(frozen=True)
class DoneEvent:
    output: GenerationOutput
    queue_time_s: float


@dataclass(frozen=True)
class ErrorEvent:
    error: Exception


@dataclass(frozen=True)
class CancelledEvent:
    pass


Event = TextEvent | DoneEvent | ErrorEvent | CancelledEvent


@dataclass
class Job:
    """One generation request, as the worker sees it."""

    prompt_ids: list[int]
    method_config: Any  # a frozen method config from the registry (has .build(loaded))
    method_name: str
    settings: GenerationConfig
    endpoint: str
    stream: bool
    sink: Callable[[Event], None]  # called from the worker thread; must be thread-safe
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    """A bounded FIFO queue in front of one worker thread that owns the engine."""

    def __init__(
        self,
        engine: Engine,
        max_queue: int,
        metrics: ServerMetrics,
        proposer_for: Callable[[Any], Any] | None = None,
    ) -> None:
        """`proposer_for(config)`: the proposer a job's method config runs with (default: built afresh)."""
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.proposer_for = proposer_for or (lambda config: config.build(engine.loaded))
        self.max_queue = max_queue
        self.metrics = metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="specdec-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return int(self._running is not None)

    @property
    def worker_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise QueueClosed("the server is shutting down")
            if len(self._waiting) + self.num_running > self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting); retry later")
            self._waiting.append(job)
            self.metrics.waiting.set(len(self._waiting))
            self._cond.notify()

    def close(self, timeout_s: float) -> None:
        """Refuse new jobs, cancel the waiting and the running ones, and wait for the worker."""
        with self._cond:
            self._closed = True
            for job in [*self._waiting, *([self._running] if self._running else [])]:
                job.cancel()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("the decode worker did not stop within %.1f s", timeout_s)

    def _next(self) -> Job | None:
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            self._running = self._waiting.popleft()
            self.metrics.waiting.set(len(self._waiting))
            return self._running

    def _work(self) -> None:
        while (job := self._next()) is not None:
            self.metrics.running.set(1)
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running = None
                self.metrics.running.set(0)

    def _run(self, job: Job) -> None:
        queue_time_s = time.perf_counter() - job.submitted_at
        if job.cancelled.is_set():
            self._finish(job, CancelledEvent(), "cancelled")
            return
        self.metrics.queue_seconds.observe(queue_time_s)
        chunks = self.metrics.text_chunks.labels(job.method_name)

        def on_text(text: str) -> None:
            if job.cancelled.is_set():
                raise _Cancelled
            chunks.inc()
            if job.stream:
                job.sink(TextEvent(text))

        try:
            proposer = self.proposer_for(job.method_config)
            output = self.engine.generate(job.prompt_ids, proposer, job.settings, on_text=on_text)
        except _Cancelled:
            self._finish(job, CancelledEvent(), "cancelled")
        except Exception as error:  # noqa: BLE001 - reported to this job's client; the worker goes on
            if not isinstance(error, ValueError):
                log.exception("generation failed")
            self._finish(job, ErrorEvent(error), "failed")
        else:
            self._finish(job, DoneEvent(output, queue_time_s), "completed", output)

    def _finish(self, job: Job, event: Event, outcome: str, output: GenerationOutput | None = None) -> None:
        self.metrics.record_outcome(job.endpoint, job.method_name, outcome, output.stats if output else None)
        try:
            job.sink(event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            pass

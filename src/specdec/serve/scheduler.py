"""Continuous batching: a bounded queue of generation jobs (fair across API keys) and the worker that decodes them.

Why: on a CPU a forward pass over 8 tokens costs about what a pass over 1 does,
so one worker thread runs up to `max_batch` requests in one batched decode loop
(`specdec.engine.batch.Batch`): between two steps it admits waiting jobs into free rows,
drops cancelled ones (a joining prompt between two of its prefill chunks), and
hands finished ones their output. A prompt that joins running rows is prefilled
a chunk per step, so no prompt stalls the running streams for longer than one
chunk's pass. The event loop stays free to accept, validate and stream requests and
to answer /health and /metrics.

Invariants:
- waiting jobs are admitted round-robin across API keys, in submission order
  within a key (`specdec.serve.fair`); at most `max_queue` jobs wait (running
  ones not counted, nor the free rows), a key at most its share of them and of
  the rows; a submit beyond that raises `QueueFull` and changes nothing;
- a job's events go only to that job's own `sink`: zero or more `TextEvent`s
  (only when it streams), then exactly one `DoneEvent`, `ErrorEvent` or
  `CancelledEvent`;
- each running job holds its own proposer, taken from `acquire(config, state_scope)`
  (the server's `ProposerPool`; the scope keeps what proposers learn across
  requests apart per API key) and handed back with `release` when it ends;
  `begin(prompt_ids)` resets its per-request state, so no token one request
  drafted or saw can reach another, and a row's output never depends on the
  other rows (`specdec.engine.loop`);
- a cancelled job never starts, or leaves the batch at the next step boundary;
- the worker never dies on a job's error: a failing proposer ends its own row; a
  failing batched pass fails the rows in it and the worker starts a fresh batch;
  `close()` refuses new jobs, cancels the waiting and the running ones, and
  joins the worker within a bounded time;
- a drain (`stop_accepting`, `wait_idle`, then `cancel_all`) refuses new jobs
  while the accepted ones, waiting or running, go on; cancelled ones end with a
  `CancelledEvent`, which the server turns into OpenAI's `shutting_down` error.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from specdec.engine.batch import DEFAULT_PREFILL_CHUNK, Batch, Row
from specdec.engine.costs import CostModel
from specdec.engine.generation import GenerationConfig, GenerationOutput
from specdec.engine.loop import Engine
from specdec.engine.provenance import Piece
from specdec.serve.fair import FairQueue
from specdec.serve.fair import QueueFull as QueueFull  # what submit raises, defined with the queue
from specdec.serve.metrics import ServerMetrics

log = logging.getLogger("specdec.server")


class QueueClosed(Exception):
    """The server is shutting down and takes no new jobs."""


@dataclass(frozen=True)
class TextEvent:
    text: str
    piece: Piece | None = None  # the text's source, step and token index, for a job that asked (Job.sources)


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


@dataclass(eq=False)
class Job:
    """One generation request, as the worker sees it."""

    prompt_ids: list[int]
    method_config: Any  # a frozen method config from the registry (has .build(loaded))
    method_name: str
    settings: GenerationConfig
    endpoint: str
    stream: bool
    sink: Callable[[Event], None]  # called from the worker thread; must be thread-safe
    state_scope: str = ""  # whose cross-request state its proposer may use and feed (one per API key)
    sources: bool = False  # stream each text piece with its token's draft source (`specdec.engine.provenance`)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    """A bounded queue (FIFO per key, round-robin across keys) before one worker decoding up to `max_batch` jobs."""

    def __init__(
        self,
        engine: Engine,
        max_queue: int,
        metrics: ServerMetrics,
        pool: ProposerSource | None = None,
        max_batch: int = 1,
        costs: CostModel | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        max_queue_per_key: int | None = None,
        max_rows_per_key: int | None = None,
    ) -> None:
        """pool: where a job's proposer comes from (default: built afresh per job); costs: the pass cost
        curve the batch plans its width with (None: trees verified as proposed); prefill_chunk: prompt
        tokens prefilled per step while other rows decode; max_queue_per_key / max_rows_per_key: one
        key's share of the waiting jobs / the batch rows (None: all of them)."""
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine = engine
        self.pool = pool or _FreshProposers(engine)
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.costs = costs
        self.prefill_chunk = prefill_chunk
        self.metrics = metrics
        self._waiting = FairQueue(
            max_queue, max_queue if max_queue_per_key is None else max_queue_per_key, max_rows_per_key or max_batch
        )
        self._running: dict[Row, tuple[Job, Any, float]] = {}  # row -> (job, proposer, queue seconds)
        self._active: set[Job] = set()  # taken from the queue and not yet ended (being admitted or running)
        self._closed = False
        self._accepting = True  # False from the start of a drain: submits refused, accepted jobs go on
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="specdec-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._active)

    @property
    def worker_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed or not self._accepting:
                raise QueueClosed("the server is shutting down")
            free_rows = max(0, self.max_batch - self.num_running)
            self._waiting.push(job, self._running_per_key(), free_rows)
            self.metrics.waiting.set(len(self._waiting))
            self._cond.notify()

    def _running_per_key(self) -> collections.Counter[str]:
        """Jobs taken from the queue and not ended, per key (the lock is held)."""
        return collections.Counter(job.state_scope for job in self._active)

    def stop_accepting(self) -> None:
        """Refuse new jobs (QueueClosed) from now on; the waiting and running ones go on (a drain)."""
        with self._cond:
            self._accepting = False

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for no job to be waiting or running; whether that happened."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._waiting and not self._active, timeout_s)

    def cancel_all(self) -> int:
        """Cancel every waiting and running job (each ends with a CancelledEvent); how many there were."""
        with self._cond:
            jobs = [*self._waiting, *self._active]
            for job in jobs:
                job.cancel()
            self._cond.notify_all()
        return len(jobs)

    def close(self, timeout_s: float) -> None:
        """Refuse new jobs, cancel the waiting and the running ones, and wait for the worker."""
        with self._cond:
            self._closed = True
        self.cancel_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("the decode worker did not stop within %.1f s", timeout_s)

    def _admit(self, room: int) -> list[Job] | None:
        """Waiting jobs for the free rows (blocking while there is nothing to do); None: shut down."""
        with self._cond:
            while not self._waiting and not self._running and not self._closed:
                self._cond.wait()
            closing = self._closed and not self._running
            jobs = self._waiting.take_all() if closing else self._waiting.take(room, self._running_per_key())
            self._active.update(jobs)
            self.metrics.waiting.set(len(self._waiting))
        if not closing:
            return jobs
        for job in jobs:  # closed: the jobs still waiting end here, cancelled
            self._report(job, CancelledEvent(), "cancelled")
        return None

    def _new_batch(self) -> Batch:
        return self.engine.batch(self.costs, self.max_batch, self.prefill_chunk)

    def _work(self) -> None:
        batch = self._new_batch()
        while (jobs := self._admit(self.max_batch - len(batch.active))) is not None:
            for job in jobs:
                self._start(batch, job)
            for row, (job, _, _) in list(self._running.items()):
                if job.cancelled.is_set():
                    batch.cancel(row)
                    self._end(row, CancelledEvent(), "cancelled")
            try:
                finished = batch.step()
            except Exception as error:  # noqa: BLE001 - the pass failed: fail its rows, start afresh
                log.exception("a batched decoding step failed")
                for row in list(self._running):
                    self._end(row, ErrorEvent(error), "failed")
                batch = self._new_batch()
                continue
            for row in finished:
                self._settle(row)
            self.metrics.running.set(self.num_running)

    def _start(self, batch: Batch, job: Job) -> None:
        queue_time_s = time.perf_counter() - job.submitted_at
        if job.cancelled.is_set():
            self._report(job, CancelledEvent(), "cancelled")
            return
        self.metrics.queue_seconds.observe(queue_time_s)
        chunks = self.metrics.text_chunks.labels(job.method_name)

        def on_text(text: str, piece: Piece | None = None) -> None:
            chunks.inc()
            if job.stream and not job.cancelled.is_set():
                self._send(job, TextEvent(text, piece))

        # only a streaming job that asked for sources pays for recording them
        wanted = {"on_piece": lambda piece: on_text(piece.text, piece)} if job.sources and job.stream else {}

        try:
            proposer = self.pool.acquire(job.method_config, job.state_scope)
        except Exception as error:  # noqa: BLE001 - reported to this job's client
            self._report(job, ErrorEvent(error), "failed")
            return
        try:
            row = batch.add(job.prompt_ids, proposer, job.settings, **(wanted or {"on_text": on_text}))
        except Exception as error:  # noqa: BLE001 - a bad prompt: this job's error only
            self.pool.release(proposer)
            self._report(job, ErrorEvent(error), "failed")
            return
        with self._cond:
            self._running[row] = (job, proposer, queue_time_s)
        if row.finished:
            self._settle(row)

    def _settle(self, row: Row) -> None:
        job, _, queue_time_s = self._running[row]
        if row.error is not None:
            if not isinstance(row.error, ValueError):
                log.error("generation failed: %r", row.error)
            self._end(row, ErrorEvent(row.error), "failed")
        else:
            self._end(row, DoneEvent(row.output, queue_time_s), "completed", row.output)

    def _end(self, row: Row, event: Event, outcome: str, output: GenerationOutput | None = None) -> None:
        with self._cond:
            job, proposer, _ = self._running.pop(row)
        self.pool.release(proposer)
        self._report(job, event, outcome, output)

    def _report(self, job: Job, event: Event, outcome: str, output: GenerationOutput | None = None) -> None:
        self.metrics.record_outcome(job.endpoint, job.method_name, outcome, output.stats if output else None)
        with self._cond:
            self._active.discard(job)
            self._cond.notify_all()  # wait_idle may be waiting for the last one
        self._send(job, event)

    @staticmethod
    def _send(job: Job, event: Event) -> None:
        try:
            job.sink(event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            pass


class ProposerSource(Protocol):
    def acquire(self, config: Any, state_scope: str = "") -> Any: ...
    def release(self, proposer: Any) -> None: ...


class _FreshProposers:
    """A proposer built afresh for every job (no pool)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def acquire(self, config: Any, state_scope: str = "") -> Any:
        return config.build(dataclasses.replace(self.engine.loaded, state_scope=state_scope))

    def release(self, proposer: Any) -> None:
        pass

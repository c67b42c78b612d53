"""The waiting room of the decode queue: one FIFO per API key, admitted round-robin, each key's share bounded.

Why: with one FIFO a client that floods the server (one API key, many
requests) fills the queue and the batch, and every other key's request is
refused or waits behind the whole flood. Here each key (the request's
`state_scope`, "" without keys) has its own queue; free batch rows go to the
keys in turn, so a request of another key is admitted after at most one
admission per other waiting key; a key may hold at most `max_rows_per_key` of
the batch's rows and queue at most `max_queue_per_key` requests (plus the rows
it could start at once), so one key cannot take the whole queue either.

Invariants:
- within one key, jobs are admitted in submission order;
- `take` gives each free row to the key admitted least recently (a key never
  admitted first; ties in arrival order) among those with a job waiting and
  fewer than `max_rows_per_key` running: round-robin across the keys;
- `push` refuses (`QueueFull`) and changes nothing when the key's own share or
  the whole queue is full;
- not thread-safe on its own: the scheduler holds its lock around every call.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from typing import Any


class QueueFull(Exception):
    """The queue, or this key's share of it, holds as many waiting jobs as allowed."""


class FairQueue:
    """Waiting jobs per key (their `state_scope`), taken round-robin across keys."""

    def __init__(self, max_queue: int, max_queue_per_key: int, max_rows_per_key: int) -> None:
        if max_queue < 0 or max_queue_per_key < 0 or max_rows_per_key < 1:
            raise ValueError("max_queue and max_queue_per_key must be >= 0 and max_rows_per_key >= 1")
        self.max_queue = max_queue
        self.max_queue_per_key = max_queue_per_key
        self.max_rows_per_key = max_rows_per_key
        self._queues: dict[str, collections.deque[Any]] = {}  # keys with jobs waiting, in arrival order
        self._last_admitted: dict[str, int] = {}  # key -> number of its latest admission (one per known key)
        self._admissions = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        for queue in self._queues.values():
            yield from queue

    def push(self, job: Any, running: Mapping[str, int], free_rows: int) -> None:
        """Queue `job` behind its key's others, or raise QueueFull; `running`: jobs running per key."""
        key = job.state_scope
        waiting = len(self._queues.get(key, ()))
        own_rows = max(0, min(free_rows, self.max_rows_per_key - running.get(key, 0)))
        if self._count >= self.max_queue + free_rows:
            raise QueueFull(f"the queue is full ({self.max_queue} requests waiting); retry later")
        if waiting >= self.max_queue_per_key + own_rows:
            raise QueueFull(
                f"this API key has {waiting} requests waiting, its share of the queue; retry later"
            )
        self._queues.setdefault(key, collections.deque()).append(job)
        self._count += 1

    def take(self, room: int, running: Mapping[str, int]) -> list[Any]:
        """Up to `room` jobs for free rows, one key at a time in turn, none beyond a key's row share."""
        rows = collections.Counter(running)
        taken: list[Any] = []
        while len(taken) < room:
            eligible = (k for k in self._queues if rows[k] < self.max_rows_per_key)
            key = min(eligible, key=lambda k: self._last_admitted.get(k, -1), default=None)
            if key is None:
                break
            taken.append(self._pop(key))
            rows[key] += 1
        return taken

    def take_all(self) -> list[Any]:
        """Every waiting job (the queue is closing)."""
        jobs = list(self)
        self._queues.clear()
        self._count = 0
        return jobs

    def _pop(self, key: str) -> Any:
        queue = self._queues[key]
        job = queue.popleft()
        if not queue:
            del self._queues[key]
        self._count -= 1
        self._admissions += 1
        self._last_admitted[key] = self._admissions
        return job

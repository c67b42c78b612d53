"""Proposers built once per distinct method config and reused across requests (an LRU pool).

Why: building a proposer per request made `draft` reload its draft model and
`logitspec` re-read (or re-measure) its cost curve inside requests. Here the
expensive parts are prepared once at startup (each config's own `preparation()`,
`specdec.proposers.schema.Preparation`) and each
distinct frozen config's proposer is kept, least recently used first out.

Invariants:
- `prepare` (startup) is the only place expensive parts are made; `get` only
  assembles from prepared parts, and refuses (`RequestRefused`, code
  "method_not_available") a config whose parts were not prepared: `check` says
  so before a request is queued;
- at most `capacity` proposers are kept; a proposer evicted while in use stays
  valid for its user (the pool only forgets it);
- a proposer serves one generation at a time: the batching scheduler takes one
  with `acquire` (a kept idle one, or a new one when every kept one of that
  config is running in the batch) and hands it back with `release`; `get`
  returns the first kept one (for startup and one-at-a-time use). `begin(prompt_ids)`
  resets each proposer's per-request state (n-gram index, draft KV cache, Jacobi
  window). What a pooled proposer keeps across requests are its adaptive
  statistics (acceptance rates, draft-length fits): they change its speed, never
  its output, which verification keeps lossless;
- a proposer is kept per (state scope, config): `acquire(config, scope)` builds
  on the model with `state_scope` set to the scope (`LoadedModel.state_scope`),
  so what proposers learn across requests (session store, recycle table) is
  shared only by requests of one scope (the server's: one per API key);
- every method is thread-safe (one lock), so a second worker could not corrupt it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from specdec.models import LoadedModel
from specdec.proposers.schema import Preparation
from specdec.serve.options import RequestRefused

DEFAULT_CAPACITY = 8


@dataclass(frozen=True)
class PoolStats:
    builds: int  # proposers assembled (a miss)
    hits: int  # requests served by a kept proposer
    evictions: int
    size: int
    prepared: int  # sets of expensive parts made


class ProposerPool:
    """An LRU map from frozen method config to its built proposer, over parts prepared at startup."""

    def __init__(
        self, loaded: LoadedModel, capacity: int = DEFAULT_CAPACITY,
        preparation: Callable[[Any], Preparation | None] = lambda config: config.preparation(),
    ) -> None:
        """`preparation`: what a config's build needs made beforehand (its own, unless a test stands in)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.loaded = loaded
        self.capacity = capacity
        self.preparation = preparation
        # (scope, config) -> the proposers kept for it
        self._proposers: collections.OrderedDict[tuple[str, Any], list[Any]] = collections.OrderedDict()
        self._busy: set[int] = set()  # ids of acquired proposers
        self._parts: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self._builds = self._hits = self._evictions = 0

    def prepare(self, config: Any) -> None:
        """Make the expensive parts `config` needs (startup only: this may load, measure or calibrate)."""
        needs = self.preparation(config)
        with self._lock:
            if needs is not None and needs.key not in self._parts:
                self._parts[needs.key] = needs.prepare(self.loaded)

    def check(self, config: Any) -> None:
        """Refuse a config whose parts were not prepared (before its request is queued)."""
        needs = self.preparation(config)
        with self._lock:
            if needs is not None and needs.key not in self._parts:
                raise RequestRefused(needs.missing, "specdec.method", "method_not_available")

    def get(self, config: Any, scope: str = "") -> Any:
        """The first kept proposer for `config` in `scope`, or one assembled from prepared parts."""
        with self._lock:
            kept = self._proposers.get((scope, config))
            if kept:
                self._proposers.move_to_end((scope, config))
                self._hits += 1
                return kept[0]
            return self._build(config, scope)

    def acquire(self, config: Any, scope: str = "") -> Any:
        """A proposer for `config` in `scope` that no running generation holds; give it back with `release`."""
        with self._lock:
            kept = self._proposers.get((scope, config), [])
            idle = next((p for p in kept if id(p) not in self._busy), None)
            if idle is not None:
                self._proposers.move_to_end((scope, config))
                self._hits += 1
            else:
                idle = self._build(config, scope)
            self._busy.add(id(idle))
            return idle

    def release(self, proposer: Any) -> None:
        with self._lock:
            self._busy.discard(id(proposer))

    def _build(self, config: Any, scope: str) -> Any:
        """Assemble and keep a new proposer (the lock is held)."""
        needs = self.preparation(config)
        scoped = dataclasses.replace(self.loaded, state_scope="/".join(filter(None, (self.loaded.state_scope, scope))))
        if needs is None:
            proposer = config.build(scoped)
        elif needs.key not in self._parts:
            raise RequestRefused(needs.missing, "specdec.method", "method_not_available")
        else:
            proposer = needs.assemble(scoped, self._parts[needs.key])
        self._builds += 1
        self._proposers.setdefault((scope, config), []).append(proposer)
        self._proposers.move_to_end((scope, config))
        if len(self._proposers) > self.capacity:
            self._proposers.popitem(last=False)  # one still running stays valid for its user
            self._evictions += 1
        return proposer

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                self._builds, self._hits, self._evictions, len(self._proposers), len(self._parts)
            )

"""State that belongs to one loaded model and outlives any one proposer or request.

Why: Token Recycling's successor table and the cross-request session store learn
from every request a model serves, and the model's packed weights are made once
and used by every pass. Proposers are built per request (CLI, bench) or pooled
per config (server), so such state cannot live in a proposer; it lives on the
loaded model (`LoadedModel.state`, made when the model is loaded), and every
proposer built from that `LoadedModel` (or a `dataclasses.replace` of it) is
handed the same object by `config.build(loaded)`.

Invariants:
- one `ModelState` per loaded model: it goes away with the `LoadedModel`, and two
  loads never share state even if they load the same name;
- objects are told apart by a hashable `key` (e.g. the kind, the table width
  `k` and `LoadedModel.state_scope`), so configs that need different shapes, or
  methods the bench keeps apart, get different objects;
- `shared` is thread-safe: a factory runs at most once per key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class ModelState:
    """Objects kept for one loaded model, each made on first request by its factory."""

    def __init__(self) -> None:
        self._objects: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def shared(self, key: Hashable, factory: Callable[[], T]) -> T:
        """The object kept under `key`, made by `factory()` the first time it is asked for."""
        with self._lock:
            if key not in self._objects:
                self._objects[key] = factory()
            return self._objects[key]

    def clear(self) -> None:
        """Drop every object kept (tests; a server that wants a cold start)."""
        with self._lock:
            self._objects.clear()

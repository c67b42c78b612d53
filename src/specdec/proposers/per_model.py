"""State that belongs to one loaded model and outlives any one proposer or request.

Why: Token Recycling's successor table and the cross-request session store learn
from every request a model serves. Proposers are built per request (CLI, bench)
or pooled per config (server), so the learned state cannot live in a proposer;
it lives beside the model, here, and every proposer built on the same model
finds the same object.

Invariants:
- keyed by the model object itself (`LoadedModel.model`, an `nn.Module`) through
  a weak reference: the state goes away with the model, and two models never
  share state even if they have the same name;
- under one model, objects are told apart by a hashable `key` (e.g. the table
  width `k`), so configs that need different shapes get different objects;
- `shared` is thread-safe: a factory runs at most once per (model, key).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_STATE: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def shared(model: Any, key: Hashable, factory: Callable[[], T]) -> T:
    """The object kept for (`model`, `key`), made by `factory()` the first time it is asked for."""
    with _LOCK:
        per_model = _STATE.setdefault(model, {})
        if key not in per_model:
            per_model[key] = factory()
        return per_model[key]


def forget(model: Any) -> None:
    """Drop every object kept for `model` (tests; a server that wants a cold start)."""
    with _LOCK:
        _STATE.pop(model, None)

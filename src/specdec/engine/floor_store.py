"""The floor's learned rates kept on disk, so a new process starts from what earlier ones learned.

Why: the floor (`specdec.engine.floor`) finds out, step by step, whether a method's drafting pays on
this machine, and carries that to the method's next request. A process that serves one request (a CLI
run, `make demo`) or an API call that builds its own engine started from nothing every time: the floor
then spent the request learning, and a method whose drafting loses here (an EAGLE head on a fast pass)
ran that request slower than plain decoding. Kept beside the machine's cost curve, under the same key
(model, weights, kernels, machine, threads, torch), the rates reach the next process.

Invariants:
- a file that is missing, unreadable, written for another key or format, or holding anything but
  finite non-negative numbers where numbers belong is ignored as a whole: the floor starts fresh, as
  it did before; writing is atomic and a failed write is dropped (a read-only cache only costs the
  learning again);
- what is read is `resumed`: the losing mode is tried again within `EXPLORE[1]` steps, so a state
  learned on a busy machine, or on other text, does not hold for long;
- it changes no output: the floor only chooses between drafting and plain steps, both verified.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from specdec.backends.registry import cost_file, cost_key, write_json_atomic
from specdec.engine.costs import DEFAULT_CONTEXT, costs_folder, curve_sizes
from specdec.engine.floor import Floor, FloorState, resumed
from specdec.models import LoadedModel

FORMAT = 1  # the file's layout; another number is ignored


class FloorStore:
    """One file of learned floor states, kept under `key` (what tells one machine and model from another)."""

    def __init__(self, path: str | Path, key: dict) -> None:
        self.path, self.key = Path(path), key

    def read(self) -> dict[tuple[str, bool], FloorState]:
        """The states saved under this key, each `resumed`; {} where the file is absent or not to be trusted."""
        try:
            saved = json.loads(self.path.read_text())
            if saved.get("format") != FORMAT or saved.get("key") != self.key:
                return {}
            return {
                (str(item["proposer"]), _flag(item["greedy"])): resumed(_checked(FloorState(), item["state"]))
                for item in saved["states"]
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def write(self, learned: dict[tuple[str, bool], FloorState]) -> None:
        states = [
            {"proposer": name, "greedy": greedy, "state": dataclasses.asdict(state)}
            for (name, greedy), state in learned.items()
        ]
        write_json_atomic(self.path, {"format": FORMAT, "key": self.key, "states": states})


def remembered_floor(loaded: LoadedModel, folder: str | Path | None = None) -> Floor:
    """A floor that starts from, and keeps, what earlier processes learned for `loaded` on this machine
    (beside its cost curve in `folder`, the cache's costs folder by default)."""
    key = cost_key(loaded, curve_sizes(loaded)[0], DEFAULT_CONTEXT)
    return Floor(store=FloorStore(cost_file(costs_folder(folder), key).with_suffix(".floor.json"), key))


def _checked(default: object, value: object) -> object:
    """`value` read as `default`'s kind: a dataclass field by field, the one field whose default is None (the
    leader) as None or a bool, any other field as a finite number >= 0; ValueError otherwise."""
    if dataclasses.is_dataclass(default):
        if not isinstance(value, dict) or set(value) != {f.name for f in dataclasses.fields(default)}:
            raise ValueError(f"expected the fields of {type(default).__name__}")
        return type(default)(**{name: _checked(getattr(default, name), value[name]) for name in value})
    if default is None:
        return None if value is None else _flag(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"expected a finite number >= 0, got {value!r}")
    return type(default)(value)


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value

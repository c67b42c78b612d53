"""Resuming a benchmark: what a results folder already holds, and whether it is the same run.

Why: a full Spec-Bench run takes hours on a CPU, and a run that is killed (a
reboot, a time limit, Ctrl-C) must not lose what it measured. `specdec bench
--resume DIR` continues the run in DIR: it skips every (question, turn,
method) pair already in DIR/responses.jsonl and reports over all rows.

Invariants:
- while a run goes on, responses.jsonl is append-only: one line per completed
  pair, flushed as soon as the pair completes, so a kill loses at most the
  pair in flight; a torn last line (a kill mid-write) is cut off on resume;
- a folder is resumed only when its manifest's run identity equals this
  run's, key by key (`IDENTITY_KEYS`); the differing keys are named in the
  error. The question *selection* (categories, per-category, limit) may
  differ, so a run can be extended to more questions of the same file;
- a pair in the file is never run again: its row stands as written, and
  MT-bench's second turn follows the first turn's stored answer;
- an absent or empty folder starts a new run there, so `--resume DIR` can be
  used for the first run too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.bench.config import BenchConfig, BenchConfigError, BenchPlan
from specdec.bench.records import PairKey, pair_key
from specdec.choices import DEFAULT_BACKEND
from specdec.models import LoadedModel, default_device, resolve_dtype

MANIFEST = "manifest.json"
RESPONSES = "responses.jsonl"

# What must be equal for old and new rows to belong to one run (their numbers are compared side by side).
IDENTITY_KEYS = (
    "model", "dtype", "device", "max_new_tokens", "temperature", "seed", "chat", "draft_model", "methods",
    "data_sha256",
)


@dataclass(frozen=True)
class ResumeState:
    """What an earlier run left in the results folder (empty for a new run)."""

    rows: tuple[dict[str, Any], ...] = ()  # responses.jsonl, in file order
    sessions: tuple[dict[str, Any], ...] = ()  # the earlier runs' sessions, from the manifest

    @property
    def done(self) -> dict[PairKey, dict[str, Any]]:
        return {pair_key(row): row for row in self.rows}


def run_identity(config: BenchConfig, plan: BenchPlan, loaded: LoadedModel | None) -> dict[str, Any]:
    """The settings that make two runs one run (JSON values, so a manifest's copy compares equal).

    With an already-loaded model its own name, dtype, device and backend count, not the
    config's; otherwise they are resolved the way `load_model` resolves them.
    """
    if loaded is not None:
        model, dtype, device = loaded.name, loaded.dtype, loaded.device
    else:
        device = torch.device(config.model.device or default_device())
        model, dtype = config.model.name, resolve_dtype(config.model.dtype, str(device))
    identity = {
        "model": model,
        "dtype": str(dtype).replace("torch.", ""),
        "device": torch.device(device).type,
        "max_new_tokens": config.max_new_tokens,
        "temperature": float(config.temperature),
        "seed": config.seed,
        "chat": config.chat,
        "draft_model": config.draft_model,
        "methods": sorted(plan.labels),
        "data_sha256": plan.data_sha256,
    }
    backend = loaded.backend if loaded is not None else config.model.backend
    if backend != DEFAULT_BACKEND:  # only then: folders of default runs keep resuming as before
        identity["backend"] = backend
    return json.loads(json.dumps(identity))


def identity_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """'key: X there, Y here' for every identity key whose values differ (or that the old run lacks)."""
    return [
        f"{key}: {repr(old[key]) if key in old else 'not recorded'} there, {new.get(key)!r} here"
        for key in IDENTITY_KEYS
        if key not in old or old[key] != new.get(key)
    ]


def read_responses(path: Path) -> list[dict[str, Any]]:
    """The rows of responses.jsonl; a torn last line is cut from the file, a bad line elsewhere is an error."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):  # killed mid-write: the pair in flight is lost, the rest kept
        data = data[: data.rfind(b"\n") + 1]
        with path.open("r+b") as file:
            file.truncate(len(data))
    rows = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            pair_key(row)
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            raise BenchConfigError(f"cannot resume: {path}:{number} is not a responses row") from None
        rows.append(row)
    return rows


def _read_manifest(out_dir: Path) -> dict[str, Any]:
    path = out_dir / MANIFEST
    if not path.is_file():
        raise BenchConfigError(
            f"cannot resume {out_dir}: it holds no {MANIFEST}, so it is no specdec bench folder; "
            "give --out for a new run"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BenchConfigError(f"cannot resume {out_dir}: {MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("run_identity"), dict):
        raise BenchConfigError(
            f"cannot resume {out_dir}: its {MANIFEST} records no run identity (written by an older specdec)"
        )
    return manifest


def open_resume(out_dir: Path, identity: Mapping[str, Any]) -> ResumeState:
    """The earlier run in `out_dir` if it is this run; raises BenchConfigError naming what differs."""
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return ResumeState()
    manifest = _read_manifest(out_dir)
    differences = identity_differences(manifest["run_identity"], identity)
    if differences:
        raise BenchConfigError(
            f"cannot resume {out_dir}: it holds a different run ({'; '.join(differences)}); "
            "use the same settings, or --out for a new run"
        )
    sessions = manifest.get("sessions")
    return ResumeState(tuple(read_responses(out_dir / RESPONSES)), tuple(sessions if isinstance(sessions, list) else ()))

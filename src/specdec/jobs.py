"""`specdec generate --batch FILE.jsonl`: many prompts through one batched decode loop.

Why: offline jobs (evaluations, data generation) have every prompt up front; a
batch of them shares each forward pass. One JSON object per input line:
    {"prompt": "text"}  or  {"messages": [{"role": "user", "content": "..."}]}
with optional "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop"
overriding the command line's. Output: one JSON object per input line, in input
order: {"index", "text", "token_ids", "finish_reason", "stats"}.

Invariants: the whole file is read and checked before any decoding (a bad line
is reported with its line number and nothing runs); each row's output equals
that prompt run alone (`specdec.engine.loop`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from tqdm.auto import tqdm

from specdec.engine.batch import Row
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine, generate_batch
from specdec.prompts import Messages, encode_prompt
from specdec.sampling import SamplingParams

SAMPLING_KEYS = ("temperature", "top_k", "top_p", "seed")
KNOWN_KEYS = {"prompt", "messages", "max_new_tokens", "stop", *SAMPLING_KEYS}


@dataclass(frozen=True)
class BatchRequest:
    prompt: str | Messages
    chat: bool  # messages always go through the chat template
    config: GenerationConfig


def read_requests(path: str | Path, base: GenerationConfig, chat: bool) -> list[BatchRequest]:
    """Parse a JSONL file of requests; `base` and `chat` apply where a line says nothing."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"batch file not found: {path}")
    requests = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            requests.append(_parse(json.loads(line), base, chat))
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            raise ValueError(f"{path}:{number}: {err}") from None
    if not requests:
        raise ValueError(f"{path}: no requests (one JSON object per line)")
    return requests


def _parse(record: Any, base: GenerationConfig, chat: bool) -> BatchRequest:
    if not isinstance(record, dict):
        raise ValueError("each line must be a JSON object")
    unknown = set(record) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    if ("prompt" in record) == ("messages" in record):
        raise ValueError('give exactly one of "prompt" (text) or "messages" (a chat)')
    prompt = record.get("prompt", record.get("messages"))
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty")
    elif not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)):
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    sampling = base.sampling
    overrides = {key: record[key] for key in SAMPLING_KEYS if key in record}
    if overrides:
        sampling = SamplingParams(**{**_sampling_fields(sampling), **overrides})
    stop = record.get("stop", base.stop)
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    config = replace(base, max_new_tokens=record.get("max_new_tokens", base.max_new_tokens), sampling=sampling, stop=stop)
    return BatchRequest(prompt, chat or "messages" in record, config)


def _sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    return {key: getattr(sampling, key) for key in SAMPLING_KEYS}


def generate_file(
    engine: Engine, requests: list[BatchRequest], method: Any, max_batch: int, out: TextIO, progress: bool = True
) -> int:
    """Decode every request in batches, writing one JSON line per request in input order.

    A request whose generation fails gets {"index", "error"} and the others go on; returns how many failed.
    """
    prompts = [encode_prompt(engine.tokenizer, r.prompt, chat=r.chat) for r in requests]
    for number, prompt_ids in enumerate(prompts):
        try:
            engine.check_prompt(prompt_ids)
        except ValueError as err:
            raise ValueError(f"request {number}: {err}") from None
    lines: dict[int, dict] = {}
    written, failed = 0, 0
    bar = tqdm(total=len(requests), unit="prompt", disable=not progress, file=sys.stderr)

    def on_done(index: int, row: Row) -> None:
        nonlocal written, failed
        lines[index] = _record(index, row)
        failed += row.error is not None
        bar.update(1)
        while written in lines:  # in input order, as soon as every earlier line is out
            out.write(json.dumps(lines.pop(written)) + "\n")
            out.flush()
            written += 1

    costs = engine.pass_costs()
    try:
        generate_batch(
            engine, prompts, lambda: method.build(engine.loaded), [r.config for r in requests],
            costs=costs, max_batch=max_batch, on_done=on_done, raise_errors=False,
        )  # fmt: skip
    finally:
        bar.close()
    return failed


def _record(index: int, row: Row) -> dict:
    if row.error is not None:
        return {"index": index, "error": f"{type(row.error).__name__}: {row.error}"}
    out = row.output
    return {
        "index": index,
        "text": out.text,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "stats": out.stats.to_dict(),
    }

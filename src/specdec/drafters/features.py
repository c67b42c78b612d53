"""Training text for a draft head, and the target's features on it, cached to disk in shards.

Why cache: a head trains for several epochs on the same text, and the target's
pass over it (hidden states of three layers plus its own next-token choice)
costs more than the head's training step; computed once, shards are reused by
every epoch and by `--resume`.

A row of `--data` (JSONL) is `{"messages": [{"role", "content"}, ...]}` (a chat,
rendered with the target's chat template), `{"text": "..."}` or `{"input_ids":
[...]}` (already tokenized, e.g. the target's own replies). Each row
becomes one example of at most `max_len` tokens. Per example a shard keeps the
token ids, the features (`layer_ids` hidden states, concatenated, bf16) and the
target's greedy next token at every position (the label a drafted token must
match to be accepted at temperature 0).

Invariants: shards are written atomically and named by their index, so an
interrupted run resumes at the first missing one; a cache made for another
target, other layers or another length is refused, not mixed in.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.proposers.eagle import target_fingerprint

SHARD_EXAMPLES = 256
MANIFEST = "manifest.json"


def read_rows(path: str | Path, tokenizer: object, max_len: int, min_len: int = 8) -> list[list[int]]:
    """Token ids of every usable row of a JSONL file; ValueError if it has none."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data {path}: no such file")
    rows, bad = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            ids = _row_ids(json.loads(line), tokenizer)
        except (ValueError, TypeError, KeyError, AttributeError):
            bad += 1
            continue
        if ids is not None and len(ids) >= min_len:
            rows.append(ids[:max_len])
    if not rows:
        raise ValueError(
            f"--data {path}: no usable rows ({bad} unreadable); each line needs 'messages' (a chat), 'text' or "
            "'input_ids', "
            f"with at least {min_len} tokens"
        )
    return rows


def _row_ids(row: dict, tokenizer: object) -> list[int] | None:
    if isinstance(row.get("input_ids"), list):
        return [int(t) for t in row["input_ids"]]
    if isinstance(row.get("messages"), list):
        messages = [{"role": m["role"], "content": str(m["content"])} for m in row["messages"] if m.get("content")]
        if not messages:
            return None
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
            return list(ids if isinstance(ids, list) else ids["input_ids"])
        return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]
    if isinstance(row.get("text"), str) and row["text"].strip():
        return tokenizer(row["text"])["input_ids"]
    return None


@dataclass
class Example:
    tokens: torch.Tensor  # [T] int64
    features: torch.Tensor  # [T, F] bf16
    labels: torch.Tensor  # [T] int64: the target's greedy token after position t


def _signature(model: torch.nn.Module, layer_ids: tuple[int, ...], max_len: int) -> dict:
    return {
        "target_fingerprint": target_fingerprint(model.get_input_embeddings().weight),
        "layer_ids": list(layer_ids),
        "max_len": max_len,
    }


@torch.inference_mode()
def target_pass(model: torch.nn.Module, ids: list[int], layer_ids: tuple[int, ...]) -> Example:
    """The target over one example: its features at `layer_ids` and its greedy choices."""
    tokens = torch.tensor(ids, dtype=torch.int64)
    out = model(input_ids=tokens[None].to(model.device), output_hidden_states=True, use_cache=False)
    features = torch.cat([out.hidden_states[i][0] for i in layer_ids], dim=-1)
    return Example(tokens, features.to("cpu", torch.bfloat16), out.logits[0].argmax(-1).cpu())


def build_cache(
    model: torch.nn.Module, rows: list[list[int]], layer_ids: tuple[int, ...], folder: str | Path, max_len: int
) -> Path:
    """Write the shards of `rows` that `folder` lacks (resumable); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    signature = _signature(model, layer_ids, max_len) | {"examples": len(rows)}
    manifest = folder / MANIFEST
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old != signature:
            raise ValueError(f"--cache {folder} holds features of another target, layers, length or data: {old}")
    else:
        manifest.write_text(json.dumps(signature))
    shards = range(0, len(rows), SHARD_EXAMPLES)
    bar = tqdm(total=sum(map(len, rows)), unit="tok", desc="target features", dynamic_ncols=True)
    for index, start in enumerate(shards):
        chunk = rows[start : start + SHARD_EXAMPLES]
        path = folder / f"shard_{index:05d}.pt"
        if path.exists():
            bar.update(sum(map(len, chunk)))
            continue
        examples = []
        for ids in chunk:
            ex = target_pass(model, ids, layer_ids)
            examples.append({"tokens": ex.tokens, "features": ex.features, "labels": ex.labels})
            bar.update(len(ids))
        tmp = path.with_suffix(".tmp")
        torch.save(examples, tmp)
        os.replace(tmp, path)
    bar.close()
    return folder


def load_cache(folder: str | Path) -> list[Example]:
    """Every example of a feature cache, in order."""
    folder = Path(folder)
    shards = sorted(folder.glob("shard_*.pt"))
    if not shards:
        raise ValueError(f"{folder}: no feature shards")
    out = []
    for path in shards:
        out.extend(Example(**ex) for ex in torch.load(path))
    return out


def batches(examples: list[Example], tokens_per_batch: int, generator: torch.Generator) -> Iterator[list[Example]]:
    """Shuffled batches of examples of similar length, about `tokens_per_batch` padded tokens each."""
    order = torch.randperm(len(examples), generator=generator).tolist()
    # Sort within windows of 64 so a batch pads little, while the epoch's order stays random.
    windows = [sorted(order[i : i + 64], key=lambda j: len(examples[j].tokens)) for i in range(0, len(order), 64)]
    batch: list[Example] = []
    for j in (j for window in windows for j in window):
        longest = max([len(examples[j].tokens), *(len(e.tokens) for e in batch)])
        if batch and longest * (len(batch) + 1) > tokens_per_batch:
            yield batch
            batch = []
        batch.append(examples[j])
    if batch:
        yield batch


def collate(batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens, labels [B, T] (0 where padded), features [B, T, F] float32, valid [B, T] bool."""
    width = max(len(e.tokens) for e in batch)
    tokens = torch.zeros(len(batch), width, dtype=torch.int64)
    labels = torch.zeros(len(batch), width, dtype=torch.int64)
    features = torch.zeros(len(batch), width, batch[0].features.shape[-1])
    valid = torch.zeros(len(batch), width, dtype=torch.bool)
    for b, e in enumerate(batch):
        n = len(e.tokens)
        tokens[b, :n], labels[b, :n], features[b, :n], valid[b, :n] = e.tokens, e.labels, e.features.float(), True
    return tokens, labels, features, valid

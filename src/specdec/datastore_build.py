"""Building a datastore (`specdec datastore build`): tokenize files, sort their suffixes, write the folder.

Why a module of its own: building needs the corpus, the tokenizer and a sort
over every position; reading (`specdec.datastore`) needs none of that, and the
proposers and the server only read. The folder layout and its invariants are
described in `specdec.datastore`.

Invariants: a build never overwrites (the output folder must be new or empty);
files that are not UTF-8 text are skipped and counted, never fatal unless none
is left; meta.json is written last, so an interrupted build is refused when
opened; the suffix array is exact (equal to sorting every position by its first
`sort_depth` tokens, ties by position), built with numpy in O(n log n) per
prefix-doubling round over the positions still tied.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdec.datastore import (
    DEFAULT_SORT_DEPTH,
    FORMAT,
    MAX_TOKENS,
    SEPARATOR,
    VERSION,
    DatastoreError,
    tokenizer_identity,
)


def _group_heads(sorted_keys: np.ndarray) -> np.ndarray:
    """For each element of a nondecreasing array [m], the index of the first element equal to it."""
    change = np.ones(len(sorted_keys), dtype=bool)
    change[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return np.flatnonzero(change)[np.cumsum(change) - 1]


def suffix_array(tokens: np.ndarray, sort_depth: int = DEFAULT_SORT_DEPTH) -> np.ndarray:
    """Positions of `tokens` [n] sorted by their first `sort_depth` tokens, ties by position: int32 [n].

    Prefix doubling over the still-ambiguous groups only: `rank[i]` is the index in
    `order` where the group of positions sharing i's first `covered` tokens starts.
    Each round re-sorts the positions in groups of two or more by (rank[i],
    rank[i + step]) packed into one int64 key (one stable argsort, so ties keep
    position order), with step = covered, except the last round, whose windows
    overlap to end exactly at sort_depth. Random text is settled after a few
    tokens; only repeats (copied code, license headers) stay for more rounds.
    """
    n = len(tokens)
    order = np.argsort(tokens, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = _group_heads(tokens[order])
    covered = 1
    while covered < sort_depth and n > 1:
        heads = rank[order]
        repeated = heads[1:] == heads[:-1]
        ambiguous = np.zeros(n, dtype=bool)
        ambiguous[1:] |= repeated
        ambiguous[:-1] |= repeated
        slots = np.flatnonzero(ambiguous)  # whole groups, in order; each group keeps its slots
        if not len(slots):
            break
        step = min(covered, sort_depth - covered)
        members = order[slots]
        following = members + step
        second = np.zeros(len(members), dtype=np.int64)  # 0: past the end, below every real rank
        inside = following < n
        second[inside] = rank[following[inside]] + 1
        key = rank[members] * (n + 1) + second
        perm = np.argsort(key, kind="stable")
        order[slots] = members[perm]
        rank[members[perm]] = slots[_group_heads(key[perm])]
        covered += step
    return order.astype(np.int32)


def expand_files(paths: Iterable[str | Path], pattern: str = "*") -> list[Path]:
    """Files named, plus the files matching `pattern` anywhere inside folders named (sorted)."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob(pattern) if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise DatastoreError(f"{path}: no such file or folder")
    if not files:
        raise DatastoreError(f"no files matching {pattern!r} in {', '.join(map(str, paths))}")
    return files


def check_out_dir(out_dir: str | Path) -> Path:
    """`out_dir` as a Path, if it is new or an empty folder (a build never overwrites); else DatastoreError."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatastoreError(f"datastore folder {out} exists and is not empty: choose another or remove it")
    return out


def _read_texts(files: Sequence[Path]) -> tuple[list[str], int]:
    texts, skipped = [], 0
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            skipped += 1
    return texts, skipped


@dataclass(frozen=True)
class BuildSummary:
    num_files: int  # files tokenized
    num_skipped: int  # files that were not UTF-8 text or could not be read
    num_tokens: int  # separators included
    out_dir: Path


def build_datastore(
    files: Iterable[str | Path],
    tokenizer: Any,
    out_dir: str | Path,
    sort_depth: int = DEFAULT_SORT_DEPTH,
    progress: Callable[[int], None] | None = None,
    batch_files: int = 64,
) -> BuildSummary:
    """Tokenize `files` with `tokenizer` and write a datastore into `out_dir` (new or empty).

    `progress(num_files_done)` is called after each batch of files (a progress bar).
    """
    paths = [Path(f) for f in files]
    out = check_out_dir(out_dir)
    if sort_depth < 2:
        raise DatastoreError(f"sort_depth must be >= 2 (a match and its next token), got {sort_depth}")
    chunks, num_files, skipped = [], 0, 0
    for start in range(0, len(paths), batch_files):
        texts, bad = _read_texts(paths[start : start + batch_files])
        skipped += bad
        if texts:
            encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            for ids in encoded:
                chunks.append(np.asarray([*ids, SEPARATOR], dtype=np.int64))
            num_files += len(texts)
        if progress is not None:
            progress(min(start + batch_files, len(paths)))
    if not num_files:
        raise DatastoreError(f"no readable UTF-8 text among {len(paths)} file(s): nothing to index")
    tokens = np.concatenate(chunks)
    if len(tokens) > MAX_TOKENS:
        raise DatastoreError(f"{len(tokens)} tokens: a datastore holds at most {MAX_TOKENS}")
    suffixes = suffix_array(tokens, sort_depth)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", tokens.astype(np.int32))
    np.save(out / "suffixes.npy", suffixes)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "num_tokens": len(tokens),
        "num_files": num_files,
        "sort_depth": sort_depth,
        "separator": SEPARATOR,
        "tokenizer": tokenizer_identity(tokenizer),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return BuildSummary(num_files, skipped, len(tokens), out)

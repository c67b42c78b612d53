"""An external datastore for retrieval drafting (REST, He et al., NAACL 2024): a token suffix array on disk.

Why: prompt lookup only finds what the request itself already says. A corpus
of similar text (code, documentation) often continues the context where the
request cannot; REST drafts from such a datastore: a suffix array over the
corpus's token ids (the model's own tokenizer), stored as memory-mapped numpy
files, so opening costs a few reads and a lookup a few dozen binary-search
probes. This module reads datastores; `specdec.datastore_build` writes them
(`specdec datastore build`).

Layout of a datastore folder (format version 1):
- tokens.npy: int32 [n]: every file's token ids, each file followed by the
  separator -1 (so matches never span files and every continuation ends);
- suffixes.npy: int32 [n]: start positions sorted by their first `sort_depth`
  tokens, ties by position (prefix doubling stops there: a full sort is not
  needed for patterns of at most `sort_depth` tokens, and deep repeats, e.g.
  copied license headers, would make it slow);
- meta.json: format, version, sizes, sort_depth and the tokenizer's identity
  (class, name, vocabulary size and sha256 of the vocabulary), written last, so
  an interrupted build is refused as incomplete.

Lookup (`Datastore.lookup(context, max_ngram, max_continuation) -> list[int]`):
the longest suffix of the context (at most `max_ngram` and `sort_depth - 1`
tokens, at least `min_ngram`) that occurs in
the corpus is found by binary search (occurrence is monotone in the suffix
length, so the length itself is binary-searched too); the continuation is the
*most frequent next-token path*: each next token is the most frequent one among
the occurrences still matching (counted exactly in ranges of up to
`EXACT_COUNT` occurrences, else on an evenly spaced sample of them), and once a
single occurrence remains, or the sorted depth is reached, the rest is the
earliest remaining occurrence's own continuation. `branches` gives the top few
distinct first tokens, each continued the same way (REST's tree).

Invariants: every problem with a datastore folder (missing or truncated file,
bad json, wrong format or version, sizes that disagree, token ids or positions
out of range, another tokenizer) raises `DatastoreError` with the folder and
what to do, never a numpy or json exception; a datastore is read-only.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecdecError

FORMAT = "specdec-datastore"
VERSION = 1
SEPARATOR = -1
DEFAULT_SORT_DEPTH = 64
EXACT_COUNT = 256  # ranges this small are counted exactly; larger ones on a sample of this size
MAX_TOKENS = 2**31 - 1  # int32 positions


class DatastoreError(SpecdecError):
    """A datastore folder that cannot be used (missing, corrupt, or built for another tokenizer)."""


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What identifies a tokenizer's token ids: its class, name, size and a sha256 of its vocabulary."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return {
        "class": type(tokenizer).__name__,
        "name": str(getattr(tokenizer, "name_or_path", "")),
        "vocab_size": len(tokenizer),
        "sha256": digest,
    }


# ------------------------------------------------------------------ opening
def _load_array(folder: Path, name: str, length: int) -> np.ndarray:
    try:
        array = np.load(folder / name, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DatastoreError(
            f"datastore {folder}: {name} is missing; rebuild it with `specdec datastore build`"
        ) from None
    except (ValueError, OSError, EOFError) as error:
        raise DatastoreError(
            f"datastore {folder}: {name} is truncated or corrupt ({error}); rebuild it"
        ) from None
    if array.dtype != np.int32 or array.shape != (length,):
        raise DatastoreError(
            f"datastore {folder}: {name} holds {array.dtype} {array.shape}, meta.json says int32 ({length},); rebuild it"
        )
    return array.view(np.ndarray)  # plain ndarray over the mapping: cheaper slicing than np.memmap


def _read_meta(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise DatastoreError(
            f"datastore {folder} does not exist; build one with `specdec datastore build FILES -o DIR`"
        )
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        raise DatastoreError(
            f"datastore {folder}: meta.json is missing (an interrupted build?); rebuild it"
        ) from None
    except (ValueError, OSError) as error:
        raise DatastoreError(f"datastore {folder}: meta.json is unreadable ({error}); rebuild it") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatastoreError(f"datastore {folder}: meta.json is not a specdec datastore's")
    if meta.get("version") != VERSION:
        raise DatastoreError(
            f"datastore {folder}: format version {meta.get('version')!r}; this specdec reads {VERSION}"
        )
    for key, low in (("num_tokens", 1), ("sort_depth", 2)):
        if not isinstance(meta.get(key), int) or meta[key] < low:
            raise DatastoreError(f"datastore {folder}: meta.json has no valid {key}; rebuild it")
    if not isinstance(meta.get("tokenizer"), dict):
        raise DatastoreError(f"datastore {folder}: meta.json does not name its tokenizer; rebuild it")
    return meta


def _check_tokenizer(folder: Path, built: dict[str, Any], tokenizer: Any) -> None:
    ours = tokenizer_identity(tokenizer)
    if built.get("sha256") != ours["sha256"] or built.get("vocab_size") != ours["vocab_size"]:
        raise DatastoreError(
            f"datastore {folder} was built with tokenizer {built.get('name')!r} ({built.get('vocab_size')} tokens), "
            f"not this model's {ours['name']!r} ({ours['vocab_size']} tokens): rebuild it with --model"
        )


class Datastore:
    """A read-only, memory-mapped suffix array over a tokenized corpus (see the module docstring)."""

    def __init__(
        self,
        folder: Path,
        tokens: np.ndarray,
        suffixes: np.ndarray,
        meta: dict[str, Any],
        exact_count: int = EXACT_COUNT,
    ) -> None:
        self.folder = folder
        self.tokens = tokens  # [n] int32
        self.suffixes = suffixes  # [n] int32
        self.meta = meta
        self.sort_depth = int(meta["sort_depth"])
        self.exact_count = exact_count  # occurrences counted exactly; larger ranges are sampled

    @classmethod
    def open(cls, folder: str | Path, tokenizer: Any = None) -> Datastore:
        """Open a datastore folder; with `tokenizer`, refuse one built with another tokenizer."""
        path = Path(folder)
        meta = _read_meta(path)
        if tokenizer is not None:
            _check_tokenizer(path, meta["tokenizer"], tokenizer)
        n = meta["num_tokens"]
        tokens = _load_array(path, "tokens.npy", n)
        suffixes = _load_array(path, "suffixes.npy", n)
        vocab_size = meta["tokenizer"].get("vocab_size")
        limit = vocab_size if isinstance(vocab_size, int) else np.iinfo(np.int32).max
        if int(tokens[-1]) != SEPARATOR or int(tokens.min()) < SEPARATOR or int(tokens.max()) >= limit:
            raise DatastoreError(f"datastore {path}: tokens.npy holds ids outside the vocabulary; rebuild it")
        if int(suffixes.min()) < 0 or int(suffixes.max()) >= n:
            raise DatastoreError(
                f"datastore {path}: suffixes.npy holds positions outside the corpus; rebuild it"
            )
        return cls(path, tokens, suffixes, meta)

    def __len__(self) -> int:
        return len(self.tokens)

    # -------------------------------------------------------------- searching
    def _key(self, offset: int, width: int) -> Callable[[int], list[int]]:
        tokens, suffixes = self.tokens, self.suffixes

        def key(j: int) -> list[int]:
            start = int(suffixes[j]) + offset
            return tokens[start : start + width].tolist()

        return key

    def _range(self, pattern: list[int], lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """Suffix-array range [lo, hi) of the suffixes that start with `pattern`."""
        key = self._key(0, len(pattern))
        hi = len(self.suffixes) if hi is None else hi
        first = bisect_left(range(len(self.suffixes)), pattern, lo, hi, key=key)
        return first, bisect_right(range(len(self.suffixes)), pattern, first, hi, key=key)

    def _occurs(self, pattern: list[int]) -> bool:
        key = self._key(0, len(pattern))
        first = bisect_left(range(len(self.suffixes)), pattern, key=key)
        return first < len(self.suffixes) and key(first) == pattern

    def match(self, context: Sequence[int], max_ngram: int, min_ngram: int = 1) -> tuple[int, int, int]:
        """(m, lo, hi): the longest m in [min_ngram, max_ngram] whose last-m-token suffix of `context`
        occurs, with its suffix-array range; (0, 0, 0) when none does. m stays below sort_depth."""
        longest = min(max_ngram, len(context), self.sort_depth - 1)  # the next token's order is known below
        tail = [int(t) for t in context[len(context) - longest :]] if longest > 0 else []
        found, low, high = 0, max(min_ngram, 1), longest
        # Occurrence is monotone in m (a longer suffix occurs only where a shorter one does): bisect m.
        while low <= high:
            mid = (low + high) // 2
            if self._occurs(tail[longest - mid :]):
                found, low = mid, mid + 1
            else:
                high = mid - 1
        if not found:
            return 0, 0, 0
        lo, hi = self._range(tail[longest - found :])
        return found, lo, hi

    def _next_tokens(self, lo: int, hi: int, depth: int) -> list[tuple[int, int]]:
        """(count, token) of the tokens at offset `depth` of the suffixes in [lo, hi), most frequent first,
        separator excluded; counted exactly for small ranges, else on an evenly spaced sample."""
        sample = self.exact_count
        if hi - lo <= sample:
            rows = np.arange(lo, hi)
        else:
            rows = lo + (np.arange(sample, dtype=np.int64) * (hi - lo)) // sample
        values = self.tokens[self.suffixes[rows].astype(np.int64) + depth]
        tokens, counts = np.unique(values, return_counts=True)
        keep = tokens != SEPARATOR
        ranked = sorted(zip((-counts[keep]).tolist(), tokens[keep].tolist(), strict=True))
        return [(-count, token) for count, token in ranked]

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """The part of [lo, hi) (suffixes sorted by their first sort_depth tokens) with `token` at `depth`."""
        key = self._key(depth, 1)
        first = bisect_left(range(len(self.suffixes)), [token], lo, hi, key=key)
        return first, bisect_right(range(len(self.suffixes)), [token], first, hi, key=key)

    def _continue(self, lo: int, hi: int, depth: int, length: int) -> list[int]:
        """The most frequent path of `length` tokens after offset `depth` in range [lo, hi)."""
        out: list[int] = []
        while len(out) < length:
            offset = depth + len(out)
            if hi - lo == 1 or offset >= self.sort_depth:  # one occurrence left, or no order below this depth
                start = int(self.suffixes[lo]) + offset
                rest = self.tokens[start : start + length - len(out)].tolist()
                return out + rest[: rest.index(SEPARATOR)] if SEPARATOR in rest else out + rest
            ranked = self._next_tokens(lo, hi, offset)
            if not ranked:
                break
            token = ranked[0][1]
            lo, hi = self._narrow(lo, hi, offset, token)
            out.append(token)
        return out

    def branches(
        self,
        context: Sequence[int],
        max_ngram: int,
        max_continuation: int,
        max_branches: int = 1,
        min_ngram: int = 1,
    ) -> list[list[int]]:
        """Up to `max_branches` continuations of the longest suffix of `context` (min_ngram..max_ngram
        tokens) found in the corpus, with distinct first tokens, most frequent first; [] when none is."""
        if max_continuation < 1 or max_branches < 1 or max_ngram < 1:
            return []
        m, lo, hi = self.match(context, max_ngram, min_ngram)
        if not m:
            return []
        out = []
        for _count, token in self._next_tokens(lo, hi, m)[:max_branches]:
            sub_lo, sub_hi = self._narrow(lo, hi, m, token)  # m < sort_depth: sorted by the token at m
            out.append([token, *self._continue(sub_lo, sub_hi, m + 1, max_continuation - 1)])
        return out

    def lookup(
        self, context: Sequence[int], max_ngram: int, max_continuation: int, min_ngram: int = 1
    ) -> list[int]:
        """The most frequent continuation (up to `max_continuation` tokens) of the longest suffix of
        `context` (min_ngram..max_ngram tokens) found in the corpus; [] when none is found."""
        found = self.branches(context, max_ngram, max_continuation, 1, min_ngram)
        return found[0] if found else []

"""Incremental n-gram index over a growing token sequence.

Why it exists
-------------
Every retrieval drafter asks the same question once or more per decoding step:
"the context ends in these m tokens; where did they occur before, and what came
next?" Prompt lookup (PLD) asks it for the context itself, LogitSpec asks it for
the context extended by each top-k candidate of the last logit (a token that is
not in the sequence yet), and lookahead decoding keeps its pool keyed the same
way. Rescanning the prompt and generated text each step costs O(length) per
query; this index makes each query a handful of dict look-ups and each new token
a constant amount of work, so drafting stays in the microseconds however long
the context grows.

Structure and invariants
------------------------
The index holds the sequence `tokens` (prompt + accepted tokens, append-only)
and, for each n in 1..max_ngram, a dict from an n-gram to the position where
its *continuation* starts:

- key: the n tokens `tokens[i - n : i]` (an int for n == 1, a tuple otherwise);
  value: `i`, the position of the first token that followed them.
- An n-gram is registered only when its continuation's first token arrives, so
  every stored position satisfies `n <= i < len(tokens)`: a match always has at
  least one continuation token, and the sequence's own final n-gram (which has
  nothing after it yet) never matches itself.
- `prefer="latest"`: the value is the largest such i (a later token simply
  overwrites). `prefer="earliest"`: the smallest such i (set once, never
  overwritten). Either way both policies are O(1) per registration.

A query takes the last m tokens of `suffix`, for m from max_ngram down to
min_ngram; the first m with a match wins, and the answer is up to
`max_continuation` tokens of the indexed sequence starting at the stored
position. `suffix` need not be a prefix of the indexed sequence: it may end with
tokens that are not indexed (LogitSpec's candidate next token).

Complexity
----------
- `extend(new)`: O(len(new) * max_ngram) time, i.e. O(1) per token for a fixed
  max_ngram (amortised: dict inserts and list appends). Long chunks (a prompt)
  go through a bulk path built on `zip` and `dict.update`; short chunks (a
  decoding step's accepted tokens) through a per-token path with less fixed
  overhead.
- `lookup(...)`: at most max_ngram dict look-ups plus an O(max_continuation)
  slice; no scanning.
- Memory: at most `len(tokens)` entries per n.

Keys are plain tuples (ints for n == 1): indexing with tuple keys took the same
time as with n-grams packed into one int by shifts, and tuples need no bound on
token ids. See
benchmarks/ngram_index_speed.py for the numbers of this implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import index as _as_int

_PREFER = ("latest", "earliest")
# Chunks at least this long take the bulk (zip + dict.update) path in `extend`;
# shorter ones the per-token loop (the two cross over between 8 and 16 tokens on CPython 3).
_BULK_MIN_TOKENS = 16


class NGramIndex:
    """Map every n-gram (n = 1..max_ngram) of a growing sequence to where it continued.

    >>> index = NGramIndex(max_ngram=2)
    >>> index.extend([5, 6, 7, 5, 6, 8])
    >>> index.lookup([1, 5, 6], max_continuation=3)
    [8]
    >>> index.lookup_with_ngram([9, 6], max_continuation=2)
    ([8], 1)
    """

    __slots__ = ("_max_ngram", "_prefer", "_latest", "_tokens", "_maps")

    def __init__(self, max_ngram: int = 3, prefer: str = "latest") -> None:
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int):
            raise ValueError(f"max_ngram must be an int >= 1, got {max_ngram!r}")
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        if prefer not in _PREFER:
            raise ValueError(f"prefer must be one of {_PREFER}, got {prefer!r}")
        self._max_ngram = max_ngram
        self._prefer = prefer
        self._latest = prefer == "latest"
        self._tokens: list[int] = []
        # _maps[n - 1]: n-gram -> start of its continuation (int keys for n == 1).
        self._maps: list[dict] = [{} for _ in range(max_ngram)]

    # ------------------------------------------------------------------ views

    @property
    def max_ngram(self) -> int:
        return self._max_ngram

    @property
    def prefer(self) -> str:
        return self._prefer

    @property
    def tokens(self) -> list[int]:
        """The indexed sequence. The index's own list: read it, never mutate it."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"NGramIndex(max_ngram={self._max_ngram}, prefer={self._prefer!r}, len={len(self._tokens)})"

    # ---------------------------------------------------------------- updates

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens and register the n-grams they complete as continuations.

        Token ids must be integers (Python or numpy ints, integer 0-d tensors);
        they are stored as Python ints.
        """
        new = [_as_int(tok) for tok in tokens]
        if not new:
            return
        if len(new) >= _BULK_MIN_TOKENS:
            self._extend_bulk(new)
        else:
            self._extend_small(new)

    def _extend_small(self, new: list[int]) -> None:
        seq = self._tokens
        maps = self._maps
        max_ngram = self._max_ngram
        latest = self._latest
        unigrams = maps[0]
        for tok in new:
            i = len(seq)
            if i:
                # The n-grams ending at i - 1 continue at i.
                window = tuple(seq[i - max_ngram : i]) if i >= max_ngram else tuple(seq)
                width = len(window)
                if latest:
                    unigrams[window[-1]] = i
                    for n in range(2, width + 1):
                        maps[n - 1][window[width - n :]] = i
                else:
                    unigrams.setdefault(window[-1], i)
                    for n in range(2, width + 1):
                        maps[n - 1].setdefault(window[width - n :], i)
            seq.append(tok)

    def _extend_bulk(self, new: list[int]) -> None:
        seq = self._tokens
        old_len = len(seq)
        seq.extend(new)
        new_len = len(seq)
        for n in range(1, self._max_ngram + 1):
            # Continuation starts i in [first, new_len) with key seq[i - n : i].
            first = max(old_len, n)
            if first >= new_len:
                continue
            positions = range(first, new_len)
            if n == 1:
                keys = seq[first - 1 : new_len - 1]
            else:
                keys = zip(*[seq[first - n + j : new_len - n + j] for j in range(n)], strict=True)
            table = self._maps[n - 1]
            if self._latest:
                table.update(zip(keys, positions, strict=True))  # later pairs overwrite earlier ones
            else:
                for key, pos in zip(keys, positions, strict=True):
                    table.setdefault(key, pos)

    # ---------------------------------------------------------------- queries

    def lookup(self, suffix: Sequence[int], max_continuation: int, min_ngram: int = 1) -> list[int]:
        """Continuation of the longest matching tail of `suffix` (see `lookup_with_ngram`)."""
        return self.lookup_with_ngram(suffix, max_continuation, min_ngram)[0]

    def lookup_with_ngram(
        self, suffix: Sequence[int], max_continuation: int, min_ngram: int = 1
    ) -> tuple[list[int], int]:
        """Find the last m tokens of `suffix` in the index, for m = max_ngram .. min_ngram.

        The first m with an occurrence (that has a continuation) wins; the occurrence
        is chosen by the `prefer` policy. Returns (up to `max_continuation` tokens of
        the indexed sequence that followed it, m), or ([], 0) when no m matches.
        `max_continuation == 0` still reports the matched m, with an empty list.
        """
        if max_continuation < 0:
            raise ValueError(f"max_continuation must be >= 0, got {max_continuation}")
        pos, m = self.find(suffix, min_ngram)
        return (self._tokens[pos : pos + max_continuation], m) if m else ([], 0)

    def find_next(self, candidates: Sequence[int]) -> list[tuple[int, int]]:
        """`find(self.tokens + [c])` for each candidate token c, in one call: (continuation start, m) or (-1, 0).

        LogitSpec asks this for each of the last logits' top-k every step: the sequence's own tail and its
        keys' prefixes are read once, not once per candidate.
        """
        seq = self._tokens
        width = min(self._max_ngram - 1, len(seq))
        tail = tuple(seq[len(seq) - width :])
        # (map, prefix) for m = width + 1 .. 2: the key of m is the last m - 1 tokens plus the candidate
        keyed = [(self._maps[m - 1], tail[width - m + 1 :]) for m in range(width + 1, 1, -1)]
        unigrams = self._maps[0]
        out = []
        for token in candidates:
            token = _as_int(token)
            for m, (table, prefix) in zip(range(width + 1, 1, -1), keyed, strict=True):
                pos = table.get((*prefix, token))
                if pos is not None:
                    out.append((pos, m))
                    break
            else:
                pos = unigrams.get(token)
                out.append((-1, 0) if pos is None else (pos, 1))
        return out

    def find(self, suffix: Sequence[int], min_ngram: int = 1) -> tuple[int, int]:
        """(where the continuation of the longest matching tail of `suffix` starts, m), or (-1, 0).

        The same search as `lookup_with_ngram`, for callers that continue the match
        themselves (e.g. periodically past the end of the sequence): the position
        is always in [m, len(self)).
        """
        if min_ngram < 1 or min_ngram > self._max_ngram:
            raise ValueError(f"min_ngram must be in [1, max_ngram={self._max_ngram}], got {min_ngram}")
        tail = tuple(map(_as_int, suffix[-self._max_ngram :]))
        width = len(tail)
        maps = self._maps
        for m in range(width, min_ngram - 1, -1):
            pos = maps[m - 1].get(tail[-1] if m == 1 else tail[width - m :])
            if pos is not None:
                return pos, m
        return -1, 0

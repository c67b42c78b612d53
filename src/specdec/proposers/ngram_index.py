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
and, for each n in 1..max_ngram, where each n-gram's *continuation* starts:

- an n-gram `tokens[i - n : i]` maps to `i`, the position of the first token
  that followed it. Unigrams are one dict (token -> i); an n-gram of n >= 2 is
  kept as its (n-1)-token prefix -> {its last token -> i} (a "follower" table;
  the prefix an int for n == 2, a tuple otherwise), so every token seen after a
  prefix is one small dict: LogitSpec's question "which of these 60 candidates
  continued the context's last tokens?" is then a look-up per candidate in that
  dict, not a tuple built and hashed per candidate and n.
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
  max_ngram (amortised: dict inserts and list appends).
- `lookup(...)`: at most 2 * max_ngram dict look-ups plus an O(max_continuation)
  slice; no scanning. `find_next(candidates)`: at most max_ngram look-ups a candidate.
- Memory: at most `len(tokens)` entries per n.

See benchmarks/ngram_index_speed.py for the numbers of this implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import index as _as_int

_PREFER = ("latest", "earliest")


class NGramIndex:
    """Map every n-gram (n = 1..max_ngram) of a growing sequence to where it continued.

    >>> index = NGramIndex(max_ngram=2)
    >>> index.extend([5, 6, 7, 5, 6, 8])
    >>> index.lookup([1, 5, 6], max_continuation=3)
    [8]
    >>> index.lookup_with_ngram([9, 6], max_continuation=2)
    ([8], 1)
    """

    __slots__ = ("_max_ngram", "_prefer", "_latest", "_tokens", "_unigrams", "_follow")

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
        self._unigrams: dict[int, int] = {}  # token -> start of its continuation
        # _follow[n - 2] for n = 2..max_ngram: the n-gram's first n - 1 tokens (an int for n == 2) ->
        # {its last token -> start of its continuation}
        self._follow: list[dict] = [{} for _ in range(max_ngram - 1)]

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
        seq = self._tokens
        unigrams, follow, latest = self._unigrams, self._follow, self._latest
        top = self._max_ngram
        for tok in map(_as_int, tokens):
            i = len(seq)
            if i:  # the n-grams ending at i - 1 continue at i
                last = seq[i - 1]
                if latest:
                    unigrams[last] = i
                else:
                    unigrams.setdefault(last, i)
                for n in range(2, min(top, i) + 1):
                    prefix = seq[i - 2] if n == 2 else tuple(seq[i - n : i - 1])
                    table = follow[n - 2].get(prefix)
                    if table is None:
                        follow[n - 2][prefix] = {last: i}
                    elif latest:
                        table[last] = i
                    else:
                        table.setdefault(last, i)
            seq.append(tok)

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

        LogitSpec asks this for each of the last logits' top-k every step: the tokens seen after the sequence's
        own last m - 1 tokens are one follower table per m, read once, then looked up once per candidate.
        """
        seq = self._tokens
        width = min(self._max_ngram - 1, len(seq))
        # (followers, m) for m = width + 1 .. 2: the tokens seen after the sequence's last m - 1 tokens
        levels = []
        for m in range(width + 1, 1, -1):
            prefix = seq[-1] if m == 2 else tuple(seq[len(seq) - m + 1 :])
            table = self._follow[m - 2].get(prefix)
            if table:
                levels.append((table, m))
        unigrams = self._unigrams
        out = []
        for token in map(_as_int, candidates):
            for table, m in levels:
                pos = table.get(token)
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
        tail = [_as_int(token) for token in suffix[-self._max_ngram :]]
        width = len(tail)
        for m in range(width, max(min_ngram, 2) - 1, -1):
            prefix = tail[-2] if m == 2 else tuple(tail[width - m : -1])
            table = self._follow[m - 2].get(prefix)
            pos = None if table is None else table.get(tail[-1])
            if pos is not None:
                return pos, m
        if min_ngram == 1 and width:
            pos = self._unigrams.get(tail[-1])
            if pos is not None:
                return pos, 1
        return -1, 0

"""Tokens to text, incrementally: streaming output and stop strings.

Why this exists: a speculative step emits several tokens at once, and a token
can end in the middle of a multi-byte character. Streaming must never print a
broken character, and a stop string may span tokens, so text is released only
once it is (a) complete (does not end in U+FFFD) and (b) cannot be the start of
a stop string still being written.

Invariant: the concatenation of every `push` result plus `finish()` is exactly
`text`; the text never contains a stop string (it is cut just before it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

_REPLACEMENT = "\ufffd"


class TextStream:
    """Incremental detokenizer with stop-string handling for one generation."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str] = ()) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""  # decoded so far (complete characters only)
        self._prefix_offset = 0
        self._read_offset = 0
        self._released = 0  # characters of self.text already handed out
        self.stopped = False
        self._decode = _backend_decode(tokenizer) or functools.partial(tokenizer.decode, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to show (maybe '')."""
        if self.stopped:
            raise RuntimeError("the stream already hit a stop string")
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.token_ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.token_ids)
        if self.stop and self._cut_at_stop():
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self._hold)

    def _cut_at_stop(self) -> bool:
        window = max(0, self._released - self._hold)
        hits = [i for i in (self.text.find(s, window) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
        return bool(hits)

    def finish(self) -> str:
        """End of generation: flush what is held back (incomplete characters included)."""
        if not self.stopped:
            tail = self._decode(self.token_ids[self._prefix_offset :])
            prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
            self.text += tail[len(prefix) :]
            self._read_offset = len(self.token_ids)
            self._prefix_offset = self._read_offset
            if self.stop:
                self.stopped = self._cut_at_stop()
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self._released)
        out = self.text[self._released : upto]
        self._released = upto
        return out


def _backend_decode(tokenizer: object) -> Callable[[list[int]], str] | None:
    """The tokenizers library's own decode where transformers' `decode` would return just what it returns (a
    fast tokenizer that overrides no decode step and cleans up no spaces), else None. A stream decodes twice a
    token, and transformers' conversions around the call cost more than the call itself."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    if type(tokenizer)._decode is not TokenizersBackend._decode or type(tokenizer).decode is not TokenizersBackend.decode:
        return None
    return functools.partial(backend.decode, skip_special_tokens=True)

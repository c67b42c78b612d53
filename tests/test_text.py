"""The text stream's decode (`specdec.text`): the tokenizers library's own call where transformers' `decode`
returns just what it returns, transformers' otherwise; and the stream's text equals the whole decode."""

from __future__ import annotations

import copy

import torch

from specdec.text import TextStream, _backend_decode


def test_the_backend_decode_is_transformers_decode(default_model):
    tokenizer = default_model.tokenizer
    assert _backend_decode(tokenizer) is not None  # SmolLM2's: a fast BPE tokenizer that cleans up no spaces
    data = torch.Generator().manual_seed(0)
    special = list(tokenizer.all_special_ids)
    text = "Ünïcödé ✓ 日本語 and a split emoji 🙂, then code:\n    return x  # done"
    sequences = [tokenizer.encode(text), [], special + tokenizer.encode(text) + special[:1]]
    sequences += [torch.randint(0, tokenizer.vocab_size, (n,), generator=data).tolist() for n in (1, 3, 17, 64)]
    stream = TextStream(tokenizer)
    for ids in sequences:
        for end in range(len(ids) + 1):  # every prefix: ends inside multi-byte characters too
            assert stream._decode(ids[:end]) == tokenizer.decode(ids[:end], skip_special_tokens=True)


def test_a_tokenizer_that_cleans_up_spaces_keeps_transformers_decode(default_model):
    tokenizer = copy.copy(default_model.tokenizer)
    tokenizer.clean_up_tokenization_spaces = True
    assert _backend_decode(tokenizer) is None


def test_the_streamed_text_is_the_whole_decode(default_model):
    tokenizer = default_model.tokenizer
    ids = tokenizer.encode("Ünïcödé ✓ 日本語 🙂 and more text.")
    stream, pieces = TextStream(tokenizer), []
    for token in ids:
        pieces.append(stream.push(token))
    pieces.append(stream.finish())
    assert "".join(pieces) == stream.text == tokenizer.decode(ids, skip_special_tokens=True)

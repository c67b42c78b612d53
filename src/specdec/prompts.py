"""Prompts to token ids: plain text, or chat messages through the model's chat template.

Kept apart from the engine so the CLI, the benchmark and the server all build
prompts the same way (and so outputs compare token for token across them).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

Messages = Sequence[dict[str, str]]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | Messages, chat: bool = False) -> list[int]:
    """Token ids for `prompt`; `chat=True` (or a message list) applies the chat template."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        if not chat:
            return tokenizer(prompt, add_special_tokens=True)["input_ids"]
        prompt = [{"role": "user", "content": prompt}]
    if not prompt:
        raise ValueError("the message list is empty")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; use a plain-text prompt")
    ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]

"""An experimental "grouped" attention (tried, not kept: no measured gain in a whole pass; see
docs/benchmarks.md, "Long prompts"): eager attention's arithmetic with the query heads of a group
stacked against their shared key head, so the KV cache is never expanded (repeat_kv). Importing
this registers it with transformers as "gqa" (masks: eager's). Run the scripts of this folder from
it (`cd benchmarks/attention_experiments && python gqa.py`): they import this module by name."""
import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask


def gqa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, h, q, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    g = h // hkv
    qg = query.reshape(b, hkv, g * q, d)
    scores = torch.matmul(qg, key.transpose(2, 3)) * scaling  # [b, hkv, g*q, L]
    if attention_mask is not None:
        scores = (scores.view(b, hkv, g, q, length) + attention_mask[:, :, None, :, :length]).view(b, hkv, g * q, length)
    elif q > 1:
        causal = torch.ones(q, length, dtype=torch.bool).tril(length - q)
        scores = scores.view(b, hkv, g, q, length).masked_fill(~causal, float("-inf")).view(b, hkv, g * q, length)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value)  # [b, hkv, g*q, d]
    return out.view(b, h, q, d).transpose(1, 2).contiguous(), None

AttentionInterface.register("gqa", gqa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register("gqa", eager_mask)

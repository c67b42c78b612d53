"""fp32 reference logits for held-out prompts: the default path's own 4-bit/8-bit blocks dequantized into an fp32 HF model."""
import collections
import os
import sys

import torch

sys.path.insert(0, os.environ.get("SRC", str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src")))
from specdec.backends.registry import verifier
from specdec.data import load_questions
from specdec.kernels import q4_kernel as K
from specdec.models import load_model
from specdec.prompts import encode_prompt

loaded = load_model("smollm2-135m")
src = verifier(loaded).model
ref = load_model("smollm2-135m", dtype="fp32", pack="off", exact="off").model.float().eval()
ref.config._attn_implementation = "eager"
def dq(mod):
    w = K.dequantize_q4(*mod.blocks()) if isinstance(mod, K.Q4Linear) else K.dequantize_q8(*mod.blocks())
    return w.float().reshape(mod.out_features, mod.in_features)
with torch.no_grad():
    for a, b in zip(src.model.layers, ref.model.layers, strict=False):
        q, k, v = dq(a.self_attn.qkv_proj).split([576, 192, 192])
        b.self_attn.q_proj.weight.copy_(q)
        b.self_attn.k_proj.weight.copy_(k)
        b.self_attn.v_proj.weight.copy_(v)
        b.self_attn.o_proj.weight.copy_(dq(a.self_attn.o_proj))
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(b.mlp, n).weight.copy_(dq(getattr(a.mlp, n)))
        b.input_layernorm.weight.copy_(a.input_layernorm.weight.float())
        b.post_attention_layernorm.weight.copy_(a.post_attention_layernorm.weight.float())
    ref.model.norm.weight.copy_(src.model.norm.weight.float())
    ref.model.embed_tokens.weight.copy_(src.model.embed_tokens.weight.float())
    ref.lm_head.weight = torch.nn.Parameter(dq(src.lm_head))
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if 11 <= seen[q.category] <= 16:
        held.append(q)
out = []
with torch.inference_mode():
    for q in held:
        ids = torch.tensor(encode_prompt(loaded.tokenizer, q.turns[0], chat=True))
        out.append(ref(ids[None]).logits[0, 1:].float())
torch.save(out, os.environ.get("REF", "/tmp/specdec-ref.pt"))
print("saved", sum(o.shape[0] for o in out))

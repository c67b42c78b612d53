"""Top-1 agreement of the default exact 4-bit path with the same weights' fp32 reference, teacher-forced on held-out prompts."""
import collections
import os
import sys

import torch

sys.path.insert(0, os.environ.get("SRC", str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src")))
from specdec.backends.registry import verifier
from specdec.data import load_questions
from specdec.models import load_model
from specdec.prompts import encode_prompt

loaded = load_model("smollm2-135m")
t = verifier(loaded)
ref = torch.load(os.environ.get("REF", "/tmp/specdec-ref.pt")) if os.path.exists(os.environ.get("REF", "/tmp/specdec-ref.pt")) else None
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if 11 <= seen[q.category] <= 16:
        held.append(q)
agree = n = 0
kl = 0.0
for i, q in enumerate(held):
    ids = torch.tensor(encode_prompt(loaded.tokenizer, q.turns[0], chat=True))
    t.prefill(ids[:1])
    ours = t.append(ids[1:]).float()
    r = ref[i]
    agree += (ours.argmax(-1) == r.argmax(-1)).sum().item()
    n += r.shape[0]
    kl += torch.nn.functional.kl_div(ours.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="sum").item()
print(f"top-1 agreement with fp32 {agree}/{n} = {agree/n:.4%}, mean KL(ref||ours) {kl/n:.5f}")

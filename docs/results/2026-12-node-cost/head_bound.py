"""Could a 4-bit shadow of the 8-bit head find the greedy argmax exactly while reading fewer bytes? The shadow's
logits plus a rigorous bound on their error leave a set of candidates that must hold the argmax; only those would be
scored on the 8-bit head. This counts them on real decoding: the head's inputs from `plain` generations (64 tokens)
of held-out Spec-Bench turns (the 13th question of the 80-question categories, second turns of two MT-bench
questions), the last row of each head call.

The bundled head is Q8_0 (an fp16 scale per 32 weights); the shadow is its Q4_1 requantization (fp16 scale and
minimum per 32). Activations are quantized as the kernels do (d = max|x| / 127, round half to even), so the only
difference between the two logits is the weights': |exact - shadow| <= sum_b d_b * sum_k |q_k| * E_b, with E_b the
block's largest weight error (or one E a token). Usage: python head_bound.py"""

import gc
import json
from pathlib import Path

import torch

from specdec.backends.torch import fused
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.kernels import q4_i8
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

QUESTIONS = Path(__file__).parents[3] / "src/specdec/datasets/spec_bench/question.jsonl"


def held_out_turns() -> list[str]:
    by_category: dict[str, list[dict]] = {}
    for line in QUESTIONS.read_text().splitlines():
        question = json.loads(line)
        by_category.setdefault(question["category"], []).append(question)
    turns = [qs[12]["turns"][0] for qs in by_category.values() if len(qs) > 12]
    return turns + [by_category["writing"][0]["turns"][1], by_category["coding"][0]["turns"][1]]


def head_inputs(loaded) -> tuple[torch.nn.Module, torch.Tensor]:  # noqa: ANN001
    engine = Engine(loaded)
    engine.generate(encode_prompt(loaded.tokenizer, "Hi", chat=True), parse_method("plain").build(loaded),
                    GenerationConfig(max_new_tokens=2, ignore_eos=True))
    head = next(o for o in gc.get_objects() if isinstance(o, fused.FusedDecoder)).head
    rows: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda module, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1])[-1:].clone()))
    for text in held_out_turns():
        engine.generate(encode_prompt(loaded.tokenizer, text, chat=True), parse_method("plain").build(loaded),
                        GenerationConfig(max_new_tokens=64, ignore_eos=True))
    hook.remove()
    return head, torch.cat(rows)


def main() -> None:
    loaded = load_model("smollm2-135m", dtype="bf16")
    head, x = head_inputs(loaded)
    q8, s8 = q4_i8.deinterleave8(head.qs, head.scale)
    V, K = q8.shape
    exact_w = q8.double().reshape(V, K // 32, 32) * s8.double()[..., None]
    low, high = exact_w.min(-1).values, exact_w.max(-1).values
    scale, minimum = ((high - low) / 15).half().double(), low.half().double()
    q4 = torch.clamp(torch.round((exact_w - minimum[..., None]) / torch.where(scale == 0, 1, scale)[..., None]), 0, 15)
    error = (exact_w - (q4 * scale[..., None] + minimum[..., None])).abs().amax(-1)  # [V, blocks]
    blocks = x.double().reshape(-1, K // 32, 32)
    d = blocks.abs().amax(-1) / 127
    xq = torch.round(blocks / torch.where(d == 0, 1, d)[..., None]) * d[..., None]
    exact = torch.einsum("rbk,vbk->rv", xq, exact_w)
    shadow = torch.einsum("rbk,vbk->rv", xq, q4 * scale[..., None] + minimum[..., None])
    mass = xq.abs().sum(-1)  # [rows, blocks]
    print(f"{len(x)} head rows; the 8-bit weights' median |w| {float(exact_w.abs().median()):.4f}, the shadow's largest "
          f"error {float(error.max()):.4f}")
    for name, bound in (("a bound per block", mass @ error.T), ("one bound a token", mass.sum(-1, keepdim=True) * error.amax(-1))):
        assert bool(((exact - shadow).abs() <= bound + 1e-9).all())
        floor = (shadow - bound).amax(-1, keepdim=True) - 0.25  # a margin for bf16's rounding near the top logit
        kept = shadow + bound >= floor
        assert bool(kept.gather(1, exact.argmax(-1, keepdim=True)).all())
        counts = kept.sum(-1).sort().values
        print(f"{name}: candidates median {int(counts[len(counts) // 2])}, 90th percentile "
              f"{int(counts[int(len(counts) * 0.9)])} of {V}; the bound's median {float(bound.median()):.2f} logits")
    top = exact.topk(2, -1).values
    gaps = (top[:, 0] - top[:, 1]).sort().values
    print(f"the exact logits' top-two gap: median {float(gaps[len(gaps) // 2]):.2f}")


if __name__ == "__main__":
    main()

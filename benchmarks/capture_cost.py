"""What capturing the target's features costs a one-node pass (SmolLM2-135M, default path, ~500 tokens of context).

    .venv/bin/python benchmarks/capture_cost.py

Times `FusedDecoder.run` with no capture, with the last state (Medusa, Hydra) and with EAGLE-3's
layers (2, 15, 27), each through the fused pass's stretches (how it runs now) and through one
`decoder_layer` call per layer (how a captured pass ran before); min and median of 200 passes, two
rounds. Run it alone.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

sys.path.insert(0, "src")
from specdec.backends.registry import verifier  # noqa: E402
from specdec.backends.torch.fused import _slot_tensors  # noqa: E402
from specdec.models import load_model  # noqa: E402

CONTEXT = 500


def per_layer(fused, input_ids, cache, capture):  # noqa: ANN001, ANN201 - the captured pass as it ran before
    batch, tokens = input_ids.shape
    positions = (CONTEXT + torch.arange(tokens))[None].expand(batch, -1)
    starts = (positions + 1).contiguous()
    tail, counts = torch.zeros(batch, tokens, 0, dtype=torch.int64), torch.zeros_like(starts)
    hidden = fused.embed(input_ids)
    cos, sin = fused.angles(hidden, positions)
    layers = [layer.claim(batch, fused.kv_heads, fused.dim, hidden.dtype, tokens) for layer in cache.layers]
    total, states = len(fused.layers), {}
    wanted = {index % (total + 1) for index in capture}
    for index, (weights, parts, (keys, values, write)) in enumerate(
        zip(fused.layers, fused.parts, _slot_tensors(layers), strict=True)
    ):
        if index in wanted:
            states[index] = hidden
        hidden = torch.ops.specdec_layer.decoder_layer(
            hidden, weights, cos, sin, keys, values, write, starts, tail, counts, fused.heads, fused.kv_heads,
            fused.eps, fused.scale, parts)  # fmt: skip
    hidden = torch.ops.specdec_layer.decoder_pass(
        hidden, fused._stretch(0, 0), cos, sin, [], [], [], starts, tail, counts, fused.heads, fused.kv_heads,
        fused.eps, fused.scale, fused.norm_weight, fused.norm_eps)  # fmt: skip
    states[total] = hidden
    return fused.head(hidden[:, -1:]), torch.cat([states[index % (total + 1)] for index in capture], -1)


def main() -> None:
    target = verifier(load_model("smollm2-135m"))
    fused = target._fused
    prompt = torch.randint(100, 20000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    target.reset()
    target.run(prompt, None, None, target.cache, 0, last_only=True)
    token = torch.tensor([[123]])
    stretches = lambda capture: fused.run(token, None, None, target.cache, CONTEXT, True, capture)  # noqa: E731
    layered = lambda capture: per_layer(fused, token, target.cache, capture)  # noqa: E731
    cases = [("no capture, stretches", stretches, ()), ("last state, stretches", stretches, (-1,)),
             ("last state, a call per layer", layered, (-1,)), ("EAGLE-3 layers, stretches", stretches, (2, 15, 27)),
             ("EAGLE-3 layers, a call per layer", layered, (2, 15, 27))]  # fmt: skip
    for round_ in range(2):
        for name, run, capture in cases:
            seconds = []
            for _ in range(200):
                start = time.perf_counter()
                run(capture)
                seconds.append(time.perf_counter() - start)
                for layer in target.cache.layers:
                    layer.truncate(CONTEXT)
            print(f"round {round_}, {name}: min {1000 * min(seconds):.3f} ms, median "
                  f"{1000 * statistics.median(seconds):.3f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

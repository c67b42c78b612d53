"""Decode tokens/s (prefill left out) per method from `specdec bench` rows: sum of new tokens over sum of
(wall - prefill) seconds, overall and by category, and x plain."""

import collections
import json
import sys

for path in sys.argv[1:]:
    tok = collections.Counter()
    sec = collections.Counter()
    for line in open(path):
        r = json.loads(line)
        for key in (r["method"], (r["method"], r["category"])):
            tok[key] += r["new_tokens"]
            sec[key] += r["wall_time_s"] - r["prefill_s"]
    methods = [m for m in tok if isinstance(m, str)]
    cats = sorted({k[1] for k in tok if isinstance(k, tuple)})
    print(path)
    for m in methods:
        base = tok["plain"] / sec["plain"]
        print(
            f"  {m:10s} {tok[m] / sec[m]:6.1f} {tok[m] / sec[m] / base:.3f}x | "
            + " ".join(
                f"{c[:5]} {tok[m, c] / sec[m, c] / (tok['plain', c] / sec['plain', c]):.2f}" for c in cats
            )
        )

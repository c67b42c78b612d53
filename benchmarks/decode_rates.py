"""Decode-only and end-to-end tokens/s of `specdec bench` result folders, side by side.

Decode tokens/s leaves the prefill out (tokens after the first over wall time minus prefill time),
summed over every turn of a folder: what a user waits for once the answer starts. Each folder's
`plain` is its own baseline; folders must come from one sitting to be compared.

    .venv/bin/python benchmarks/decode_rates.py NAME=FOLDER [NAME=FOLDER ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path


def rates(folder: Path) -> dict[str, dict[str, float]]:
    """method -> decode tokens/s, end-to-end tokens/s, MAT, share of turns equal to `plain`, turns."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    path = folder / "responses.jsonl"
    if not path.is_file():  # published folders keep their rows gzipped
        path = folder / "responses.jsonl.gz"
    with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as rows:
        lines = rows.read().splitlines()
    for line in lines:
        r = json.loads(line)
        s = sums[r["method"]]
        s["tokens"] += r["new_tokens"]
        s["decode_tokens"] += r["new_tokens"] - 1
        s["wall"] += r["wall_time_s"]
        s["decode_wall"] += r["wall_time_s"] - r["prefill_s"]
        s["steps"] += r["decode_steps"]
        s["same"] += bool(r.get("match_plain"))
        s["turns"] += 1
    return {
        method: {"decode": s["decode_tokens"] / s["decode_wall"], "e2e": s["tokens"] / s["wall"],
                 "mat": s["decode_tokens"] / s["steps"] if s["steps"] else 1.0, "same": s["same"] / s["turns"],
                 "turns": s["turns"]}
        for method, s in sums.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="NAME=FOLDER")
    parser.add_argument("--reference", default=None, help="NAME/METHOD every row is divided by (decode tokens/s)")
    args = parser.parse_args()
    table = {}
    for item in args.folders:
        name, _, folder = item.partition("=")
        for method, row in rates(Path(folder)).items():
            table[f"{name}/{method}"] = row
    base = table[args.reference]["decode"] if args.reference else None
    print("| configuration / method | decode tokens/s | end-to-end tokens/s | MAT | same text as its plain |"
          + (f" decode vs {args.reference} |" if base else ""))
    print("|---|---:|---:|---:|---:|" + ("---:|" if base else ""))
    for key, row in table.items():
        ratio = f" {row['decode'] / base:.2f}x |" if base else ""
        print(f"| {key} | {row['decode']:.1f} | {row['e2e']:.1f} | {row['mat']:.2f} | "
              f"{row['same'] * row['turns']:.0f}/{row['turns']:.0f} |{ratio}")


if __name__ == "__main__":
    main()

#!/bin/bash
# The self-distilled Medusa and Hydra heads and their learning curve (run from the repository root; ~1 h on
# two cores: replies ~10 min, the target's features ~25 min, training ~30 min). SELF_INSTRUCT and OASST are
# clones of the repositories benchmarks/head_data.py pins.
set -euo pipefail
W=${W:-/tmp/self-distilled}
R=benchmarks/results/2026-11-self-distilled-heads
mkdir -p $W
.venv/bin/python benchmarks/head_data.py --self-instruct "$SELF_INSTRUCT" --oasst "$OASST" -o $W/train.jsonl
.venv/bin/python benchmarks/self_distill.py $W/train.jsonl -o $W/replies.jsonl --batch 16 --max-new-tokens 384
python3 $R/split.py $W/train.jsonl $W/replies.jsonl $W
for arch_data in medusa:d25 medusa:d50 medusa:d100 medusa:dmix hydra:d100 hydra:dmix; do
  arch=${arch_data%%:*} data=${arch_data##*:}
  holdout=$(python3 -c "print(65.5 / sum(1 for _ in open('$W/$data.jsonl')))")
  .venv/bin/specdec-hf train --arch $arch --data $W/$data.jsonl -o $W/$arch-$data --cache $W/feat-$data \
    --draft-vocab 4096 --epochs 2 --holdout $holdout
done
# every head on the same 66 held-out rows (the shipped ones before these too, if kept at OLD)
.venv/bin/python benchmarks/head_accuracy.py --cache $W/feat-d100 --last 66 $W/medusa-* $W/hydra-* ${OLD:-}

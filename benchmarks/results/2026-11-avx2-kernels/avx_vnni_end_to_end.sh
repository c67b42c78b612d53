#!/bin/bash
# An AVX2 CPU with AVX-VNNI, emulated: checkout A (before the avx_vnni path: avx2 products) against checkout B,
# in the order A B B A, `plain` and `logitspec` on 12 held-out turns (benchmarks/kernel_paths.py); each side with
# its own cache folder. Run alone, from the repository root:
#   git worktree add /tmp/before <commit before it>
#   benchmarks/results/2026-11-avx2-kernels/avx_vnni_end_to_end.sh /tmp/before . OUT_DIR
set -euo pipefail
A="$(cd "${1:?DIR_A}" && pwd)"; B="$(cd "${2:?DIR_B}" && pwd)"; OUT="${3:?OUT_DIR}"
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 SPECDEC_KERNELS=avx2
mkdir -p "$OUT"
for tag in A B B A; do
  dir=$A; [ "$tag" = B ] && dir=$B
  echo "== $tag $dir"
  XDG_CACHE_HOME="$OUT/cache-$tag" PYTHONPATH="$dir/src" "$ROOT/.venv/bin/python" "$ROOT/benchmarks/kernel_paths.py" \
    bf16 auto auto plain logitspec 2>&1 | grep -v "it/s\|Loading\|converting"
done

#!/usr/bin/env bash
# Each experiment: apply its diff to the extension's sources, build (on first use), time, restore the sources.
# Run from the repository root, alone: bash docs/results/2026-12-node-cost/run.sh
set -euo pipefail
here=docs/results/2026-12-node-cost
py=${PYTHON:-.venv/bin/python}
csrc=src/specdec/kernels/csrc
run() {  # run DIFF OUTPUT SCRIPT ARGS...
    local diff=$1 out=$2
    shift 2
    git apply "$here/$diff"
    trap 'git checkout -- "$csrc"' EXIT
    "$py" "$@" 2>&1 | grep -av "Loading weights" | tee "$here/$out"
    git checkout -- "$csrc"
    trap - EXIT
}
run phase-timers.diff phases.txt "$here/phases.py" 1,2,3,4,8 300
run quantize-grain.diff quantize-grain.txt "$here/switch_ab.py" specdec_qgrain int 16,4,2 1,2,4,8 60
run prefetch-nta.diff prefetch-nta.txt "$here/switch_ab.py" specdec_prefetch_nta int 0,1 1,2,4,8 60
run dynamic-groups.diff dynamic-groups.txt "$here/switch_ab.py" specdec_dynamic int 0,2,8 1,2,4,8 40
run prefetch-next-product.diff prefetch-next-product.txt "$here/switch_ab.py" specdec_pf_bytes long 0,16384,1073741824 1,2,4,8 60
"$py" "$here/head_bound.py" 2>&1 | grep -av "Loading weights" | tee "$here/head-bound.txt"
"$py" "$here/products_alone.py" 20 | tee "$here/products-alone.txt"
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" > "$here/machine.txt"
lscpu | grep -E "Model name|CPU family|^Model:|Thread|Core|Socket|L2|L3" >> "$here/machine.txt"
for flag in avx512_bf16 avx512_vnni amx_tile; do
    grep -qw "$flag" /proc/cpuinfo && echo "$flag: yes" || echo "$flag: no"
done >> "$here/machine.txt"

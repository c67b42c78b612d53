#!/usr/bin/env bash
# One sitting, alone: what a pass and a decode cost with exact verification on specdec's attention kernel
# (the new default) and the GGUF's Q8_0 head on the 8-bit block kernel, beside the checkout before them,
# and beside llama.cpp.
# Resumable: each step writes its own file and is skipped when that file exists.
# Usage: run.sh BEFORE_KERNELS_COMMIT
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-exact-default
py=$PWD/.venv/bin/python
before=${1:?commit before the kernels}
for pair in "before:$before"; do
  dir=/tmp/specdec-wt-${pair%%:*}
  [ -d $dir ] || git worktree add -f $dir ${pair#*:} -q
done
[ -s $out/machine.txt ] || lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:.*\(avx512_bf16\).*/Flags: ... avx512_bf16 .../' > $out/machine.txt
uptime >> $out/machine.txt
# A checkout's own sources and its own cache (models, cost curves, the extension build): builds never clash.
as() { local name=$1; shift; if [ "$name" = new ]; then "$@"; else
  (cd /tmp/specdec-wt-$name && PYTHONPATH=/tmp/specdec-wt-$name/src XDG_CACHE_HOME=/tmp/specdec-xdg-$name "$@"); fi; }
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
bench() {  # name checkout flags methods per_category
  local dir=$PWD/$out/bench-$1
  [ -s "$dir/summary.md" ] && return
  rm -rf "$dir"
  echo "== bench-$1" >&2
  as $2 $py -m specdec.cli bench --dtype bf16 $3 --methods $4 --per-category $5 --max-new-tokens 128 \
    --out "$dir" --no-progress > "$dir.log" 2>&1
}
step products.md $py benchmarks/q4_products.py --repeats 15
for run in A1:before B1:new; do  # the checkouts' defaults: exact off before, auto now
  step step_cost-${run%%:*}.md as ${run#*:} $py benchmarks/step_cost.py --dtype bf16 --backend torch,torch-int4 \
    --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 15
done
bench bf16 new "" plain,logitspec 10
bench int4 new "--pack int4" plain,logitspec 10
bench llamacpp new "--backend llamacpp" plain 10
uptime >> $out/machine.txt

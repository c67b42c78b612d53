#!/usr/bin/env bash
# specdec's 4-bit kernel beside PyTorch's int4 kernel, oneDNN bf16 and llama.cpp, in one sitting, alone.
# Resumable: each step writes its own file and is skipped when that file exists.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-q4-kernel
py=.venv/bin/python
lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:.*\(avx512_bf16\).*/Flags: ... avx512_bf16 .../' > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
step products.md $py benchmarks/q4_products.py --repeats 15
step step_cost.md $py benchmarks/step_cost.py --dtype bf16 --backend torch,torch-int4,llamacpp --pack on \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 15
for config in "bf16:--pack auto" "int4:--pack int4" "int4-exact:--pack int4 --exact on" "llamacpp:--backend llamacpp"; do
  name=${config%%:*}; flags=${config#*:}
  methods=plain,logitspec
  [ "$name" = llamacpp ] && methods=plain
  [ -s "$out/bench-$name/summary.md" ] && continue
  rm -rf "$out/bench-$name"
  .venv/bin/specdec-hf bench --dtype bf16 $flags --methods $methods --per-category 10 --max-new-tokens 128 \
    --out "$out/bench-$name" --no-progress > "$out/bench-$name.log" 2>&1
done
uptime >> $out/machine.txt

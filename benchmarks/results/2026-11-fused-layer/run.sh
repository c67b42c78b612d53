#!/usr/bin/env bash
# One sitting, alone: the exact 4-bit pass with one C++ call per decoder layer (the new default for GGUF
# models in bf16 on a CPU with AVX-512 BF16) beside the checkout before it and beside llama.cpp.
# Resumable: each step writes its own file and is skipped when that file exists.
# Usage: run.sh BEFORE_COMMIT
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-fused-layer
py=$PWD/.venv/bin/python
before=${1:?the commit before the fused pass}
dir=/tmp/specdec-wt-before
[ -d $dir ] || git worktree add -f $dir $before -q
[ -s $out/machine.txt ] || lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:.*\(avx512_bf16\).*/Flags: ... avx512_bf16 .../' > $out/machine.txt
uptime >> $out/machine.txt
# A checkout's own sources and its own cache (cost curves, the extension build): builds never clash.
as() { local name=$1; shift; if [ "$name" = new ]; then "$@"; else
  (cd /tmp/specdec-wt-$name && PYTHONPATH=/tmp/specdec-wt-$name/src XDG_CACHE_HOME=/tmp/specdec-xdg-$name "$@"); fi; }
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
bench() {  # name checkout flags methods
  local dir=$PWD/$out/bench-$1
  [ -s "$dir/summary.md" ] && return
  rm -rf "$dir"
  echo "== bench-$1" >&2
  as $2 $py -m specdec.cli bench --dtype bf16 $3 --methods $4 --per-category 10 --max-new-tokens 128 \
    --out "$dir" --no-progress > "$dir.log" 2>&1
}
# Pass costs at 512 tokens of context: the engine's passes (exact: the invariant plan) and llama.cpp's.
step step_cost.md $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact,torch-exact,llamacpp \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 15
bench default new "" plain,logitspec,pld
bench int4-before before "--pack int4" plain,logitspec
bench llamacpp new "--backend llamacpp" plain
$py benchmarks/decode_rates.py default=$out/bench-default int4-before=$out/bench-int4-before \
  llamacpp=$out/bench-llamacpp > $out/decode.md
uptime >> $out/machine.txt
# The server's probe (same answers, a joining prompt, two keys, a shutdown), on the new defaults.
[ -s $out/serve_probe.json ] || $py benchmarks/serve_probe.py --out $out/serve_probe.json > $out/serve_probe.md 2>&1
# model.generate(custom_generate=specdec.decoder(...)) against specdec.generate on the same prompts.
if [ -f benchmarks/custom_generate_overhead.py ]; then
  step custom_generate.md $py benchmarks/custom_generate_overhead.py --out $out/custom_generate.json
fi
# Trained heads: medusa against hydra (greedy), and eagle's drawn trees under SpecInfer's and SpecTr's rules (T = 1).
bench heads new "" plain,medusa,hydra
bench spectr new "--temperature 1.0 --seed 0" plain,eagle:sampled=true,accept=specinfer,eagle:sampled=true,accept=spectr
$py benchmarks/decode_rates.py heads=$out/bench-heads spectr=$out/bench-spectr > $out/decode-heads.md
uptime >> $out/machine.txt

#!/usr/bin/env bash
# One sitting, alone: specdec's exact 4-bit pass once tree attention multiplies bf16 probabilities into the values
# (vdpbf16ps) and a tree pass reads each node's key sequence without a mask, beside llama.cpp's own tools
# (llama-bench for pass costs, llama-server for decoding, plain and with its n-gram speculation) on the bundled
# SmolLM2 GGUF and the pulled Qwen2.5-Coder-1.5B GGUF, and beside the checkout before (BEFORE: fp32 P.V).
# Resumable: each step writes its own file and is skipped when that file exists.
# Usage: run.sh BEFORE_COMMIT
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-bf16-probabilities
py=$PWD/.venv/bin/python
before=${1:?the commit before the bf16 probabilities}
bin=$($py benchmarks/llamacpp_bench.py --build-only | tail -1)
bench_bin=$(dirname "$bin")/llama-bench
smol=$($py -c "from specdec.models import load_model; print(load_model('smollm2-135m', dtype='bf16').gguf_path)" 2>/dev/null | tail -1)
qwen=$HOME/.cache/specdec/pulled/qwen2.5-coder-1.5b.gguf
dir=/tmp/specdec-wt-before
[ -d $dir ] || git worktree add -f $dir $before -q
[ -s $out/machine.txt ] || lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:.*\(avx512_bf16\).*\(avx512_vnni\).*/Flags: ... avx512_bf16 ... avx512_vnni .../' > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
# Pass costs at 512 tokens of context: llama-bench (-p N at depth 512: one pass over N tokens), the engine's passes.
step llama-bench-smollm2.md $bench_bin -m "$smol" -p 1,2,4,8,16 -n 32 -d 512 -t 2 -r 5 -o md
step step_cost-smollm2.md $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 21
step llama-bench-qwen.md $bench_bin -m "$qwen" -p 1,2,4,8 -n 16 -d 512 -t 2 -r 3 -o md
step step_cost-qwen.md $py benchmarks/step_cost.py --model qwen2.5-coder-1.5b --dtype bf16 \
  --backend torch-int4-exact --contexts 512 --sizes 1,2,4,8 --no-profile --repeats 7
uptime >> $out/machine.txt
# Spec-Bench first 10 per category (first turns, 60 prompts), 128 new tokens, greedy: llama-server plain and
# with each n-gram speculation type, specdec at default settings.
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
# Qwen2.5-Coder-1.5B on the coding and math questions (MT-Bench's, first turns: 20 prompts).
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods plain,logitspec --spec-types ngram-mod \
  --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt
# The checkout before beside this one, default settings, 70 Spec-Bench turns (specdec's bench).
as() { local name=$1; shift; if [ "$name" = new ]; then "$@"; else
  (cd /tmp/specdec-wt-$name && PYTHONPATH=/tmp/specdec-wt-$name/src XDG_CACHE_HOME=/tmp/specdec-xdg-$name "$@"); fi; }
bench() {  # name checkout flags methods
  local d=$PWD/$out/bench-$1
  [ -s "$d/summary.md" ] && return
  rm -rf "$d"
  echo "== bench-$1" >&2
  as $2 $py -m specdec.cli bench --dtype bf16 $3 --methods $4 --per-category 10 --max-new-tokens 128 \
    --out "$d" --no-progress > "$d.log" 2>&1
}
bench default new "" plain,logitspec
bench default-before before "" plain,logitspec
$py benchmarks/decode_rates.py default=$out/bench-default default-before=$out/bench-default-before > $out/decode.md
uptime >> $out/machine.txt

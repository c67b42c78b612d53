#!/usr/bin/env bash
# One sitting, alone: the exact int4 pass with every decoder layer and the final norm in one C++ call
# (`decoder_pass`) and rotary angles from per-position tables, against the pass before (one call per layer,
# transformers' final norm and rotary module), in alternating processes on held-out turns (`ab-*.txt`); then the
# pass costs beside llama-bench and the Spec-Bench comparisons beside llama-server, interleaved per prompt.
# BEFORE: a worktree of the commit before the change (made here if missing), BEFORE_CACHE its own XDG cache
# (its extension build and timing cache). Resumable: each step writes its own file, skipped when it exists.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-one-call-pass
py=$PWD/.venv/bin/python
before=${BEFORE:-/tmp/specdec-before}
before_cache=${BEFORE_CACHE:-$before-cache}
if [ ! -d "$before" ]; then
  change=$(git log --format=%H -1 --grep='^fused pass: every layer and the final norm in one C++ call')
  git worktree add --detach "$before" "$change^"
fi
[ -s $out/machine.txt ] || lscpu | grep -E "Model name" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
side() {  # after|before, then ab.py's arguments
  local which=$1; shift
  if [ "$which" = before ]; then
    SRC=$before/src XDG_CACHE_HOME=$before_cache $py benchmarks/results/2026-11-one-call-pass/ab.py "$@" 2>/dev/null | tail -1 | sed "s/^/before /"
  else
    SRC=$PWD/src $py benchmarks/results/2026-11-one-call-pass/ab.py "$@" 2>/dev/null | tail -1 | sed "s/^/after  /"
  fi
}
abba() { for order in "after before" "before after" "after before"; do for which in $order; do side $which "$@"; done; done; }
# Held-out turns only: SmolLM2 questions 11-12 of every category; Qwen2.5-Coder-1.5B math_reasoning 11-14 (MT-bench's
# coding and math hold 10 questions each, all reported).
step ab-smollm2.txt abba smollm2-135m plain,logitspec 11 12
step ab-qwen.txt abba qwen2.5-coder-1.5b plain,logitspec 11 14 math_reasoning
uptime >> $out/machine.txt
bin=$($py benchmarks/llamacpp_bench.py --build-only | tail -1)
bench_bin=$(dirname "$bin")/llama-bench
smol=$($py -c "from specdec.models import load_model; print(load_model('smollm2-135m', dtype='bf16').gguf_path)" 2>/dev/null | tail -1)
qwen=$HOME/.cache/specdec/pulled/qwen2.5-coder-1.5b.gguf
step llama-bench-smollm2.md $bench_bin -m "$smol" -p 1,2,4,8,16 -n 32 -d 512 -t 2 -r 5 -o md
step step_cost-smollm2.md $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 21
step llama-bench-qwen.md $bench_bin -m "$qwen" -p 1,2,4,8 -n 16 -d 512 -t 2 -r 3 -o md
step step_cost-qwen.md $py benchmarks/step_cost.py --model qwen2.5-coder-1.5b --dtype bf16 \
  --backend torch-int4-exact --contexts 512 --sizes 1,2,4,8 --no-profile --repeats 7
uptime >> $out/machine.txt
# Spec-Bench first turns (the first 10 of each category), 128 new tokens, greedy, every engine on each prompt in turn.
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --interleave --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods plain,logitspec --spec-types ngram-mod --interleave \
  --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt

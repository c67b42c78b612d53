#!/usr/bin/env bash
# One sitting, alone: Qwen2.5-Coder-1.5B on Spec-Bench's coding and math questions (first 10 each), 128 new
# tokens, greedy, every engine on each prompt in turn beside llama-server; the 0.5B draft on the fused pass with
# its head over the first 32768 token ids, alone and with prompt lookup as its lookahead plus runner-up leaves.
# Then the one-token passes of both models beside llama-bench's. Resumable: each step writes its own file.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-fused-draft
py=$PWD/.venv/bin/python
[ -s $out/machine.txt ] || lscpu | grep -E "Model name|CPU family|Model:|MHz" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
draft=draft:draft_model=qwen2.5-coder-0.5b,vocab=32768
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods "plain,logitspec,$draft,$draft,jump=2,fill=6" \
  --spec-types ngram-mod --interleave --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt
# A second sitting of the same (on the code that reads a fused draft's prompt in chunks), then SmolLM2's 60 first
# turns at default settings beside llama-server, to place this build's default method on this machine again.
step spec-bench-qwen-repeat.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods "plain,logitspec,$draft,jump=2,fill=6" \
  --spec-types ngram-mod --interleave --out $out/spec-bench-qwen-repeat.jsonl
uptime >> $out/machine.txt
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --interleave --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt

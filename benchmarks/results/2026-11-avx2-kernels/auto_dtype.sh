#!/bin/bash
# One sitting, alone on the machine: an emulated AVX2 CPU (as run.sh), every method in bf16 (what `--dtype auto` now
# gives a GGUF model there) and in fp32 (what it gave before). Run from the repository root; writes
# docs/results/2026-11-avx2-kernels/auto-dtype.txt.
set -u
out=docs/results/2026-11-avx2-kernels/auto-dtype.txt
emu="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 SPECDEC_KERNELS=avx2"
methods="plain logitspec pld eagle medusa"
{
  uptime; lscpu | grep -E "Model name"
  echo "== emulated AVX2, bf16 (the new auto for a GGUF source)"
  env $emu PYTHONPATH=src .venv/bin/python benchmarks/kernel_paths.py bf16 auto auto $methods 2>&1 | grep -v "Loading\|timing attention"
  echo "== emulated AVX2, fp32 (auto before)"
  env $emu PYTHONPATH=src .venv/bin/python benchmarks/kernel_paths.py fp32 auto auto $methods 2>&1 | grep -v "Loading\|timing attention"
  uptime
} > "$out" 2>&1

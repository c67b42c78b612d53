#!/bin/bash
# One sitting, alone on the machine: an AVX2 CPU emulated on an AVX-512 one (PyTorch and oneDNN held to AVX2,
# specdec's kernels capped at AVX2 by SPECDEC_KERNELS), the settings such a CPU resolves to today (fp32) against
# bf16 on the portable fused exact pass, then the machine's own default. Run from the repository root; writes
# docs/results/2026-11-avx2-kernels/sitting.txt.
set -u
out=docs/results/2026-11-avx2-kernels/sitting.txt
emu="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 SPECDEC_KERNELS=avx2"
{
  uptime; lscpu | grep -E "Model name|^Flags" | cut -c1-120
  echo "== emulated AVX2, fp32 (what such a CPU resolves to today)"
  env $emu .venv/bin/python benchmarks/kernel_paths.py fp32 auto auto 2>&1 | grep -v "Loading\|timing attention"
  echo "== emulated AVX2, bf16: int4 on the portable fused exact pass"
  env $emu .venv/bin/python benchmarks/kernel_paths.py bf16 auto auto 2>&1 | grep -v "Loading\|timing attention"
  echo "== the machine's own default (AVX-512)"
  .venv/bin/python benchmarks/kernel_paths.py auto auto auto 2>&1 | grep -v "Loading\|timing attention"
  uptime
} > "$out"

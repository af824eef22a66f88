#!/bin/bash
# An AVX2-only CPU estimated on this one (docs/benchmarking.md): torch, oneDNN and MKL held to AVX2, specexec's
# kernels built for x86-64-v3 (their own build and measurements); NGram k=3 on the shipped Q4_1 file, as
# ../2026-11-29-activation-quantize/run.sh runs it on the native build (Spec-Bench and HumanEval, c=1 and 8).
# Run from the repository root on a quiet machine; about 10 minutes.
set -u
here=bench/reports/2026-11-29-avx2-estimate
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 SPECEXEC_CPU_MARCH=x86-64-v3
lscpu > "$here/cpu.txt"
for dataset in specbench humaneval; do
  specexec bench --config bench/reports/2026-11-29-activation-quantize/configs.yaml --baseline none \
    --dataset $dataset --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 --concurrency 1,8 \
    --output "$here/$dataset.json" > "$here/$dataset.txt" 2>&1
done

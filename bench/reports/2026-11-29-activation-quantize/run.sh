#!/bin/bash
# Run from the repository root on a quiet machine; about 15 minutes on the 2-core EPYC.
set -u
here=bench/reports/2026-11-29-activation-quantize
lscpu > "$here/cpu.txt"
for dataset in specbench extraction humaneval; do
  specexec bench --config "$here/configs.yaml" --baseline none --dataset $dataset --num-requests 8 --max-tokens 128 \
    --ignore-eos --repeats 3 --concurrency 1,8 --output "$here/$dataset.json" > "$here/$dataset.txt" 2>&1
done

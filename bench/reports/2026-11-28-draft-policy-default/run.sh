#!/bin/bash
# Run from the repository root on a quiet machine; about 8 minutes on the 2-core EPYC.
set -u
here=bench/reports/2026-11-28-draft-policy-default
lscpu > "$here/cpu.txt"
specexec bench --config "$here/configs.yaml" --baseline none --dataset specbench --num-requests 8 --max-tokens 128 \
  --ignore-eos --repeats 3 --concurrency 1,8 --output "$here/specbench.json" > "$here/specbench.txt" 2>&1

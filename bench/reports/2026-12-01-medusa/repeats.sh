#!/usr/bin/env bash
# Spec-Bench at c=1, three interleaved passes (each cell the median), then multiturn at c=1 and 8 (one
# pass). Run from the repository root: bash bench/reports/2026-12-01-medusa/repeats.sh (about 20 minutes)
set -euo pipefail
here=bench/reports/2026-12-01-medusa
out=${OUT:-$here}
python -m specexec bench --dataset specbench --config "$here/repeats.yaml" --max-tokens 128 --concurrency 1 \
  --num-requests 16 --repeats 3 --output "$out/specbench-repeats.json" 2>/dev/null | tee "$out/specbench-repeats.txt"
python -m specexec bench --dataset multiturn --config "$here/medusa.yaml" --max-tokens 128 --concurrency 1,8 \
  --num-requests 16 --output "$out/multiturn.json" 2>/dev/null | tee "$out/multiturn.txt"

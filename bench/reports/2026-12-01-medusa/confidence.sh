#!/usr/bin/env bash
# Medusa under draft_len_policy auto and confidence: Spec-Bench at c=1 (three interleaved passes), then
# HumanEval at c=1 and 8 (one pass). Run from the repository root:
# bash bench/reports/2026-12-01-medusa/confidence.sh (about 10 minutes)
set -euo pipefail
here=bench/reports/2026-12-01-medusa
out=${OUT:-$here}
python -m specexec bench --dataset specbench --config "$here/confidence.yaml" --max-tokens 128 --concurrency 1 \
  --num-requests 16 --repeats 3 --output "$out/confidence-specbench.json" 2>/dev/null | tee "$out/confidence-specbench.txt"
python -m specexec bench --dataset humaneval --config "$here/confidence.yaml" --max-tokens 128 --concurrency 1,8 \
  --num-requests 16 --output "$out/confidence-humaneval.json" 2>/dev/null | tee "$out/confidence-humaneval.txt"

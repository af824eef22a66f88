#!/usr/bin/env bash
# EAGLE-3's chain, its static tree (siblings) and its dynamic (EAGLE-2) trees on Spec-Bench at c=1, three
# interleaved passes (each cell the median). From the repository root (about 12 minutes):
#   bash bench/reports/2026-12-01-eagle2-tree/measure.sh
set -euo pipefail
here=bench/reports/2026-12-01-eagle2-tree
out=${OUT:-$here}
python -m specexec bench --dataset specbench --config "$here/trees.yaml" --max-tokens 128 --concurrency 1 \
  --num-requests 16 --repeats 3 --output "$out/specbench.json" 2>/dev/null | tee "$out/specbench.txt"

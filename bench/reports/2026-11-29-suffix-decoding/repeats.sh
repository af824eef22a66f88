#!/usr/bin/env bash
# The batch-1 ratios of Suffix and NGram again, three passes taking turns (none, NGram, Suffix, none, ...),
# on Spec-Bench and BFCL. Run from the repository root.
set -euo pipefail
here=bench/reports/2026-11-29-suffix-decoding
for set in specbench bfcl; do
  extra=(); [ "$set" = bfcl ] && extra=(--tool-choice required)
  python -m specexec bench --config "$here/repeats.yaml" --dataset "$set" "${extra[@]}" --num-requests 16 \
    --max-tokens 128 --concurrency 1 --repeats 3 --output "$here/repeats-$set.json" 2>/dev/null \
    | tee "$here/repeats-$set.txt"
done

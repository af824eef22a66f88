#!/usr/bin/env bash
# Medusa (the heads shipped for SmolLM2) beside none, NGram and EAGLE-3 (chain and tree) on four sets at
# c=1 and 8, 16 requests x 128 tokens, the default configuration (the shipped Q4_1 codes); multiturn is in
# repeats.sh.
# Run from the repository root: bash bench/reports/2026-12-01-medusa/measure.sh  (about 12 minutes)
set -euo pipefail
here=bench/reports/2026-12-01-medusa
out=${OUT:-$here}
common=(--config "$here/medusa.yaml" --max-tokens 128 --concurrency 1,8 --num-requests 16)
for set in ${SETS:-specbench bfcl humaneval extraction}; do
  extra=(); [ "$set" = bfcl ] && extra=(--tool-choice required)
  python -m specexec bench --dataset "$set" "${extra[@]}" "${common[@]}" --output "$out/$set.json" 2>/dev/null \
    | tee "$out/$set.txt"
done
lscpu > "$out/cpu.txt"

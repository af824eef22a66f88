#!/usr/bin/env bash
# After the policy changes (trees or chains per step, probes priced by the drafter's cost, no drafting
# for forced slots) and with Lookahead: HumanEval, Spec-Bench and BFCL at c=1 and 8, 16 requests x 128
# tokens. Run from the repository root: bash bench/reports/2026-11-29-token-trees/after.sh
set -euo pipefail
here=bench/reports/2026-11-29-token-trees
out=${OUT:-$here}
common=(--config "$here/after.yaml" --max-tokens 128 --concurrency 1,8 --num-requests 16)
for set in humaneval specbench bfcl; do
  extra=(); [ "$set" = bfcl ] && extra=(--tool-choice required)
  python -m specexec bench --dataset "$set" "${extra[@]}" "${common[@]}" --output "$out/after-$set.json" 2>/dev/null \
    | tee "$out/after-$set.txt"
done

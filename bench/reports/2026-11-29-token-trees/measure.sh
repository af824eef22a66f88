#!/usr/bin/env bash
# Issue 57's benchmark for token trees and LayerSkip: specexec bench over five sets at c=1 and 8 (16
# requests x 128 tokens; multiturn 8 conversations x 5 turns): NGram and EAGLE-3 as chains and as trees,
# LayerSkip, beside none. Run from the repository root: bash bench/reports/2026-11-29-token-trees/measure.sh
set -euo pipefail
here=bench/reports/2026-11-29-token-trees
out=${OUT:-$here}
mkdir -p "$out"
lscpu > "$out/cpu.txt"
common=(--config "$here/drafters.yaml" --max-tokens 128 --concurrency 1,8)
run() {  # name, then bench arguments
  local name=$1; shift
  python -m specexec bench "$@" "${common[@]}" --output "$out/$name.json" 2>/dev/null | tee "$out/$name.txt"
}
run specbench --dataset specbench --num-requests 16
run extraction --dataset extraction --num-requests 16
run humaneval --dataset humaneval --num-requests 16
run bfcl --dataset bfcl --tool-choice required --num-requests 16
run multiturn --dataset multiturn --num-requests 8

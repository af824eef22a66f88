#!/usr/bin/env bash
# Issue 57's benchmark: specexec bench over five sets at c=1 and 8 (16 requests x 128 tokens; multiturn 8
# conversations x 5 turns), Suffix and EAGLE-3 beside none and NGram; REST on HumanEval with a datastore of
# Python's standard library. Run from the repository root: bash bench/reports/2026-11-29-suffix-decoding/measure.sh
set -euo pipefail
here=bench/reports/2026-11-29-suffix-decoding
out=${OUT:-$here}
mkdir -p "$out"
lscpu > "$out/cpu.txt"
store=${STORE:-/tmp/stdlib-datastore.npz}
stdlib=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
python -m specexec build-datastore "$stdlib"/*.py --output "$store" 2>&1 | tail -1 | tee "$out/datastore.txt"
rest_yaml=$(mktemp --suffix .yaml)
cat "$here/drafters.yaml" > "$rest_yaml"
echo "  - name: rest-k8
    speculative_config: {decoding_type: REST, max_draft_len: 8, datastore: $store}" >> "$rest_yaml"
common=(--max-tokens 128 --concurrency 1,8)
run() {  # name, then bench arguments
  local name=$1; shift
  python -m specexec bench "$@" "${common[@]}" --output "$out/$name.json" 2>/dev/null | tee "$out/$name.txt"
}
run specbench --config "$here/drafters.yaml" --dataset specbench --num-requests 16
run extraction --config "$here/drafters.yaml" --dataset extraction --num-requests 16
run humaneval --config "$rest_yaml" --dataset humaneval --num-requests 16
run bfcl --config "$here/drafters.yaml" --dataset bfcl --tool-choice required --num-requests 16
run multiturn --config "$here/drafters.yaml" --dataset multiturn --num-requests 8

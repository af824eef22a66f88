#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# The rest of the figures: dense against HF generate, guided extraction against llama.cpp, and one
# target forward's cost (decode and a 4-row verify) at 300, 1000 and 1300 cached tokens.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
specexec bench --baseline none,hf --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos \
  --output "$here/dense_hf.json" > "$here/dense_hf.txt" 2>&1
specexec bench --config bench/reports/2026-11-27-int8-tiles/extraction.yaml --baseline llamacpp \
  --dataset extraction --num-requests 6 --max-tokens 128 --guided \
  --output "$here/extraction.json" > "$here/extraction.txt" 2>&1
python bench/reports/2026-11-27-int8-tiles/step_cost.py --context 300,1000,1300 > "$here/step_cost.txt" 2>&1

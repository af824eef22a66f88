#!/usr/bin/env bash
# The default configuration (quantization auto, speculative_config auto) against the same with
# speculative_config none, on the bench's four chat sets at concurrency 1 and 8, three interleaved passes.
set -euo pipefail
out="$(dirname "$0")"
lscpu > "$out/cpu.txt"
for set in specbench humaneval extraction multiturn; do
  specexec bench --dataset "$set" --num-requests 8 --max-tokens 128 --concurrency 1,4,8 \
    --decoding-type auto --baseline none --repeats 3 --output "/tmp/fast-defaults-$set.json" \
    > "$out/$set.txt" 2>&1
done

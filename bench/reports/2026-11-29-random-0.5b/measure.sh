#!/bin/bash
# The random 0.5B Q4_K_M (make_files.sh) beside llama.cpp: llama-bench tg128 before and after one
# `specexec bench` run with the binding's row (Spec-Bench, 8 x 128, EOS forbidden, 3 interleaved repeats,
# no drafts and NGram k=3, whose start-up curve gives the forward's cost by tokens at this size). Run from
# the repository root on a quiet machine; about 8 minutes.
set -u
here=bench/reports/2026-11-29-random-0.5b
export LLAMA_CPP_LIB_PATH=/opt/llamacpp-build/bin
export PYTHONPATH=/opt/llamacpp-binding${PYTHONPATH:+:$PYTHONPATH}
file=/opt/gguf/random-llama-0.5b-q4_k_m.gguf
/opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_before.txt" 2>&1
specexec bench --model "$file" --config bench/reports/2026-11-28-attention-bf16/configs.yaml --baseline llamacpp \
  --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 \
  --output "$here/specbench.json" > "$here/specbench.txt" 2>&1
/opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_after.txt" 2>&1

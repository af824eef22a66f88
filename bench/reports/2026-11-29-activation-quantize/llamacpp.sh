#!/bin/bash
# TPOT against llama.cpp on the Q4_0 and Q4_K_M files of ../2026-11-28-llamacpp-gguf-types (its make_files.sh),
# after the activation-quantization fix, as ../2026-11-28-gguf-q6-k/measure.sh measured Q4_K_M before it:
# llama-bench tg128 before and after one `specexec bench` run with the binding's row. Run from the repository
# root on a quiet machine; about 8 minutes.
set -u
here=bench/reports/2026-11-29-activation-quantize
export LLAMA_CPP_LIB_PATH=/opt/llamacpp-build/bin
export PYTHONPATH=/opt/llamacpp-binding${PYTHONPATH:+:$PYTHONPATH}
for kind in q4_0 q4_k_m; do
  file=/opt/gguf/smollm2-135m-instruct-$kind.gguf
  /opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${kind}_before.txt" 2>&1
  specexec bench --model "$file" --config bench/reports/2026-11-28-attention-bf16/configs.yaml --baseline llamacpp \
    --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 \
    --output "$here/specbench_$kind.json" > "$here/specbench_$kind.txt" 2>&1
  /opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${kind}_after.txt" 2>&1
done

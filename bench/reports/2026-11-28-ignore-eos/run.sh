#!/bin/bash
# Issue 55's "done when": one `specexec bench --ignore-eos` run with rows of specexec (with and without
# drafts), HF generate, llama.cpp's binding and a running `specexec serve`, on the real model (the shipped
# SmolLM2-135M-Instruct Q4_1 GGUF), each row counting the stop tokens it sampled. Run from the repository
# root on a quiet machine after ../2026-11-28-llamacpp-gguf-types/make_files.sh (the llama.cpp build);
# about 10 minutes on the 2-core EPYC.
set -u
here=bench/reports/2026-11-28-ignore-eos
export LLAMA_CPP_LIB_PATH=/opt/llamacpp-build/bin
export PYTHONPATH=/opt/llamacpp-binding${PYTHONPATH:+:$PYTHONPATH}
lscpu > "$here/cpu.txt"
port=8391
specexec serve --port $port > "$here/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
specexec bench --quantization gguf --decoding-type NGram --max-draft-len 3 --baseline none,hf,llamacpp \
  --server "http://127.0.0.1:$port" --dataset specbench --num-requests 8 --max-tokens 64 --ignore-eos \
  --output "$here/specbench.json" > "$here/specbench.txt" 2>&1

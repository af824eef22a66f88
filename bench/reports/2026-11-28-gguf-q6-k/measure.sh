#!/bin/bash
# Issue 56, first part, continued: the Q4_K_M file of ../2026-11-28-llamacpp-gguf-types (its make_files.sh) with
# its Q4_K, Q5_0 and now Q6_K tensors at their codes, beside llama.cpp on the same file, as ../2026-11-28-gguf-k-types
# measured it with Q6_K dense. Run from the repository root on a quiet machine; about 4 minutes.
set -u
here=bench/reports/2026-11-28-gguf-q6-k
export LLAMA_CPP_LIB_PATH=/opt/llamacpp-build/bin
export PYTHONPATH=/opt/llamacpp-binding${PYTHONPATH:+:$PYTHONPATH}
file=/opt/gguf/smollm2-135m-instruct-q4_k_m.gguf
lscpu > "$here/cpu.txt"
# what loads at its codes, and the resident set after loading (the file is 101 MiB)
python - "$file" > "$here/load.txt" 2>&1 <<'PY'
import resource, sys
from specexec import Executor, ExecutorConfig
executor = Executor(config=ExecutorConfig(model=sys.argv[1], quantization="gguf", progress=False))
print(executor.setup.quantization.summary())
print(f"peak resident set while loading: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
rss = next(line for line in open("/proc/self/status") if line.startswith("VmRSS"))
print(f"resident set after loading: {int(rss.split()[1]) / 1024:.0f} MiB")
PY
/opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_before.txt" 2>&1
specexec bench --model "$file" --config bench/reports/2026-11-28-attention-bf16/configs.yaml --baseline llamacpp \
  --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos --repeats 3 \
  --output "$here/specbench_q4_k_m.json" > "$here/specbench_q4_k_m.txt" 2>&1
/opt/llamacpp-build/bin/llama-bench -m "$file" -p 0 -n 128 -t 2 -r 5 > "$here/llama_bench_after.txt" 2>&1

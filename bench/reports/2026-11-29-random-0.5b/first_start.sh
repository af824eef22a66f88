#!/bin/bash
# First start of the random 0.5B Q4_K_M (make_files.sh) with an empty cache folder (the GGUF conversion,
# the C++ kernels' build and every start-up measurement included), then a second start on that cache,
# each `specexec run` in a fresh process; the choices each start logged, side by side. Run from the
# repository root on a quiet machine; the outputs go to the folder given (a later report's), else here.
set -u
here=${1:-bench/reports/2026-11-29-random-0.5b}
file=/opt/gguf/random-llama-0.5b-q4_k_m.gguf
cache=$(mktemp -d)
lscpu > "$here/cpu.txt"
for start in first second; do
  begin=$(date +%s.%N)
  SPECEXEC_CACHE_DIR=$cache specexec run --model "$file" --quantization gguf --prompt "Explain KV caching." \
    --max-tokens 16 > "$here/$start.txt" 2>&1
  status=$?
  end=$(date +%s.%N)
  echo "$start start: $(echo "$end - $begin" | bc) s (exit $status)" | tee -a "$here/starts.txt"
done
rm -rf "$cache"

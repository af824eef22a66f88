#!/bin/bash
# First start of the random 0.5B Q4_K_M with an empty cache folder (the C++ kernels' build, the GGUF's
# conversion and every start-up measurement included), then a second on that cache, each `specexec run`
# of 16 tokens in a fresh process, as `../2026-11-29-random-0.5b/first_start.sh` measured them before
# the 5-bit tiles. Run from the repository root on a quiet machine.
set -u
here=bench/reports/2026-11-29-gguf-memory
file=/opt/gguf/random-llama-0.5b-q4_k_m.gguf
cache=$(mktemp -d)
for start in first second; do
  begin=$(date +%s.%N)
  SPECEXEC_CACHE_DIR=$cache specexec run --model "$file" --quantization gguf --prompt "Explain KV caching." \
    --max-tokens 16 > "$here/${start}_start.txt" 2>&1
  status=$?
  end=$(date +%s.%N)
  echo "$start start: $(echo "$end - $begin" | bc) s (exit $status)" | tee -a "$here/starts.txt"
done
rm -rf "$cache"

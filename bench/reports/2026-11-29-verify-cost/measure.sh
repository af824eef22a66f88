#!/usr/bin/env bash
# Verify cost against llama.cpp's on the same files (bash measure.sh [OUT_FOLDER]); the files come from
# ../2026-11-29-random-0.5b/make_files.sh and ../2026-11-28-llamacpp-gguf-types (in /opt/gguf).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
lscpu | grep -E "Model name|Flags" > "$out/cpu.txt"
python "$here/verify_cost.py" /opt/llamacpp-build/bin/llama-bench \
  /opt/gguf/smollm2-135m-instruct-q4_0.gguf /opt/gguf/smollm2-135m-instruct-q4_k_m.gguf \
  /opt/gguf/random-llama-0.5b-q4_k_m.gguf 2>"$out/stderr.txt" | tee "$out/verify_cost.jsonl"

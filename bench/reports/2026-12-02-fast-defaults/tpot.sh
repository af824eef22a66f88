#!/usr/bin/env bash
# TPOT of `specexec run` without drafts: the default (quantization auto), --quantization gguf, and
# --quantization none (the old default: the GGUF dequantized), and the default with its kernels built at
# first use for -march=native instead of the library built at install; five interleaved rounds.
set -uo pipefail
prompt="Write a long story about a lighthouse keeper who finds a map in a bottle."
tpot() { "$@" --prompt "$prompt" --max-tokens 256 --decoding-type none 2>&1 >/dev/null | grep -o 'tpot=[0-9.]*ms' ; }
for round in 1 2 3 4 5; do
  echo "round $round"
  echo "  default (auto):        $(tpot specexec run)"
  echo "  --quantization gguf:   $(tpot specexec run --quantization gguf)"
  echo "  --quantization none:   $(tpot specexec run --quantization none)"
  echo "  default, -march=native built at first use: $(SPECEXEC_CPU_MARCH=native tpot specexec run)"
done

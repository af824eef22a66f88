#!/bin/bash
# The default model as Q5_K_M, with llama.cpp's llama-quantize (built from the llama-cpp-python 0.3.36
# sdist's vendor/llama.cpp, as bench/README says) from the float32 GGUF its convert_hf_to_gguf.py wrote.
set -eu
bin=${LLAMA_CPP_BIN:-/opt/llamacpp-build/bin}
"$bin/llama-quantize" /opt/gguf/smollm2-135m-instruct-f32.gguf /opt/gguf/smollm2-135m-instruct-q5_k_m.gguf Q5_K_M

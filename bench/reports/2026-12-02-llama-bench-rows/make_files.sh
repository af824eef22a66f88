#!/bin/bash
# How this report's tools and files were made (2026-12-02, a 2-core Sapphire Rapids Xeon): llama.cpp from
# llama-cpp-python 0.3.36's sdist, built without its native/AMX paths (GGML_NATIVE=OFF with AVX-512
# flags: its AMX path crashes on some VMs); the binding as the sdist's package over those libraries; the
# SmolLM2 Q4_K_M re-quantized from the shipped Q4_1 (as ../2026-11-28-llamacpp-gguf-types/make_files.sh)
# and the random 0.5B Q4_K_M (as ../2026-11-29-random-0.5b/make_files.sh). Nothing here is library code.
set -eu
PEERS=${PEERS:-/work/peers} OUT=${OUT:-/work/peers/gguf}
SRC=$PEERS/llama_cpp_python-0.3.36 V=$PEERS/llama_cpp_python-0.3.36/vendor/llama.cpp
mkdir -p "$OUT"
[ -d "$SRC" ] || (pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d "$PEERS" && tar xzf "$PEERS/llama_cpp_python-0.3.36.tar.gz" -C "$PEERS")
cmake -S "$V" -B "$V/build" -G Ninja -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
nice -n 10 cmake --build "$V/build" --target llama llama-bench llama-server llama-quantize -j2
# the binding, kept out of site-packages (PYTHONPATH=$PEERS/binding in measure.sh)
pip install 'diskcache>=5.6.1' sentencepiece
mkdir -p "$PEERS/binding" && cp -r "$SRC/llama_cpp" "$PEERS/binding/"
python bench/reports/2026-11-28-llamacpp-gguf-types/to_hf.py "$OUT/smollm2-135m-instruct-hf"
PYTHONPATH="$V/gguf-py" python "$V/convert_hf_to_gguf.py" "$OUT/smollm2-135m-instruct-hf" --outtype f32 \
  --outfile "$OUT/smollm2-135m-instruct-f32.gguf"
"$V/build/bin/llama-quantize" "$OUT/smollm2-135m-instruct-f32.gguf" "$OUT/smollm2-135m-instruct-q4_k_m.gguf" Q4_K_M 2
# the random 0.5B reads its tokenizer from /opt/gguf/smollm2-135m-instruct-hf
mkdir -p /opt/gguf && ln -sfn "$OUT/smollm2-135m-instruct-hf" /opt/gguf/smollm2-135m-instruct-hf
OUT=$OUT LLAMA_CPP_SRC=$V LLAMA_CPP_BIN=$V/build/bin bash bench/reports/2026-11-29-random-0.5b/make_files.sh

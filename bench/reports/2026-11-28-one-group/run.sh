#!/bin/bash
# Issue 42, fifth part: side by side on the same CPU, the same 8 Spec-Bench prompts and token ids.
# Three pairs of (specexec + llama.cpp in one run, OpenVINO GenAI in its own venv), alternating which
# goes first; then the concurrency runs. Writes its outputs beside itself.
set -u
here=$(cd "$(dirname "$0")" && pwd)
ov=../2026-11-27-openvino
cd "$here/../../.."  # the repository root
lscpu > "$here/cpu.txt"
spec() {
  specexec bench --config "$here/configs.yaml" --baseline llamacpp --dataset specbench --num-requests 8 \
    --max-tokens 128 --ignore-eos --output "$here/specbench_run$1.json" > "$here/specbench_run$1.txt" 2>&1
}
openvino() {
  /tmp/ov/bin/python "$here/$ov/ov_bench.py" /tmp/ovwork/smollm2-int4 /tmp/ovwork/prompts.json \
    --max-tokens 128 --threads 2 > "$here/openvino_run$1.txt" 2>&1
}
spec 1; openvino 1
openvino 2; spec 2
spec 3; openvino 3
for impl in gguf dense; do
  q=$([ $impl = gguf ] && echo gguf || echo none)
  specexec bench --quantization $q --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos \
    --concurrency 1,8 --baseline none --output "$here/concurrency_$impl.json" > "$here/concurrency_$impl.txt" 2>&1
done

#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# Issue 42, sixth part: the attention kernel and the host work around a step, before (fa66346) and after
# on the same CPU. Writes its outputs beside itself; takes about 25 minutes on the 2-core EPYC.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."  # the repository root
lscpu > "$here/cpu.txt"
before=$(mktemp -d)/specexec && mkdir -p "$before" && git archive fa66346 | tar -x -C "$before"
old() { PYTHONPATH=$(dirname "$before") "$@"; }  # the same command on the code before this report
# 1. the kernel alone, both builds in one process
python "$here/attention_ab.py" > "$here/attention_ab.txt" 2>&1
# 2. one forward (decode row, 4-row verify) and the step's share outside the stack and the LM head,
#    before and after taking turns
steps=bench/reports/2026-11-27-int8-tiles/step_cost.py
share=bench/reports/2026-11-28-one-group/host_share.py
for turn in 1 2; do
  echo "# before, turn $turn" >> "$here/step_cost.txt"; old python $steps --settings bfloat16:auto --context 300,1000,1300 2>&1 | grep -E "^(setting|bfloat16:auto +[0-9])" >> "$here/step_cost.txt"
  echo "# after, turn $turn" >> "$here/step_cost.txt"; python $steps --settings bfloat16:auto --context 300,1000,1300 2>&1 | grep -E "^(setting|bfloat16:auto +[0-9])" >> "$here/step_cost.txt"
  for d in specbench extraction; do
    old python $share --dataset $d --steps 300 2>&1 | tail -1 | sed "s/^/before $turn: /" >> "$here/host_share.txt"
    python $share --dataset $d --steps 300 2>&1 | tail -1 | sed "s/^/after $turn: /" >> "$here/host_share.txt"
  done
done
# 3. Spec-Bench beside llama.cpp and OpenVINO GenAI (its venv and export as in ../2026-11-27-openvino)
spec() {
  specexec bench --config "$here/configs.yaml" --baseline llamacpp --dataset specbench --num-requests 8 \
    --max-tokens 128 --ignore-eos --output "$here/specbench_run$1.json" > "$here/specbench_run$1.txt" 2>&1
}
openvino() {
  /tmp/ov/bin/python "$here/../2026-11-27-openvino/ov_bench.py" /tmp/ovwork/smollm2-int4 /tmp/ovwork/prompts.json \
    --max-tokens 128 --threads 2 > "$here/openvino_run$1.txt" 2>&1
}
spec 1; openvino 1
openvino 2; spec 2
# 4. guided extraction against llama.cpp, and 8 concurrent against 1
specexec bench --config bench/reports/2026-11-27-int8-tiles/extraction.yaml --baseline llamacpp --dataset extraction \
  --num-requests 6 --max-tokens 128 --guided --output "$here/extraction.json" > "$here/extraction.txt" 2>&1
specexec bench --quantization gguf --dataset specbench --num-requests 8 --max-tokens 128 --ignore-eos \
  --concurrency 1,8 --baseline none --output "$here/concurrency_gguf.json" > "$here/concurrency_gguf.txt" 2>&1
# 5. where a step's time goes (profiled)
python -m specexec.bench.profile_step --dtype bfloat16 --quantization gguf --steps 16 > "$here/profile_step.txt" 2>&1

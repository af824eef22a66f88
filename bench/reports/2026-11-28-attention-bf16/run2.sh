#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# After the bfloat16 keys' transpose (the final kernel of this part): the kernel A/B again (run.sh's
# attention_ab.txt is overwritten with it), one forward before/after, the sampled host share
# before/after (py-spy), and a third Spec-Bench pair. About 12 minutes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
before=$(mktemp -d)/specexec && mkdir -p "$before" && git archive fa66346 | tar -x -C "$before"
old() { PYTHONPATH=$(dirname "$before") "$@"; }
steps=bench/reports/2026-11-27-int8-tiles/step_cost.py
echo "# before" > "$here/step_cost_final.txt"; old python $steps --settings bfloat16:auto --context 300,1000,1300 2>&1 | grep -E "^(setting|bfloat16:auto +[0-9])" >> "$here/step_cost_final.txt"
echo "# after" >> "$here/step_cost_final.txt"; python $steps --settings bfloat16:auto --context 300,1000,1300 2>&1 | grep -E "^(setting|bfloat16:auto +[0-9])" >> "$here/step_cost_final.txt"
pip install -q py-spy
for v in before after; do
  if [ $v = before ]; then run=old; else run=; fi
  $run py-spy record --nonblocking -r 500 -f raw -o "/tmp/host_$v.raw" -- python "$here/host_sampled.py" run > /dev/null 2>&1
  echo "# $v" >> "$here/host_sampled.txt"; python "$here/host_sampled.py" share "/tmp/host_$v.raw" >> "$here/host_sampled.txt"
done
specexec bench --config "$here/configs.yaml" --baseline llamacpp --dataset specbench --num-requests 8 \
  --max-tokens 128 --ignore-eos --output "$here/specbench_run3.json" > "$here/specbench_run3.txt" 2>&1
/tmp/ov/bin/python "$here/../2026-11-27-openvino/ov_bench.py" /tmp/ovwork/smollm2-int4 /tmp/ovwork/prompts.json \
  --max-tokens 128 --threads 2 > "$here/openvino_run3.txt" 2>&1

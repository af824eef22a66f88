#!/bin/bash
export PYTHONPATH=/tmp/bpkg
cd /tmp/r12/before
while [ ! -f DONE ]; do sleep 5; done
for dt in bfloat16 float32; do
python -m specexec.cli bench --dataset specbench --num-requests 8 --max-tokens 64 --ignore-eos --concurrency 1,8 \
  --decoding-type NGram --baseline none,hf --warmup 1 --dtype $dt --output specbench2_$dt.json > specbench2_$dt.log 2>&1
done
echo done > DONE2

#!/bin/bash
# Before-figures of issue 12 at 7955c0a (profile_step.py + cpu_info.py copied in), this session's CPU.
export PYTHONPATH=/tmp/bpkg
cd /tmp/r12/before
lscpu > lscpu.txt
python -m specexec.bench.profile_step --dtype float32,bfloat16 --steps 16 --output profile.txt > profile.log 2>&1
for dt in float32 bfloat16; do
python -m specexec.cli bench --dataset specbench --num-requests 8 --max-tokens 64 --ignore-eos --concurrency 1,8 \
  --decoding-type NGram --baseline none,hf --warmup 1 --dtype $dt --output specbench_$dt.json > specbench_$dt.log 2>&1
done
python -m specexec.cli bench --dataset extraction --num-requests 6 --max-tokens 128 --concurrency 1 \
  --decoding-type NGram --baseline none,hf --warmup 1 --dtype float32 --output extraction_float32.json > extraction_float32.log 2>&1
python -m specexec.cli bench --dataset extraction --num-requests 6 --max-tokens 128 --concurrency 1 --guided \
  --decoding-type NGram --baseline none --warmup 1 --dtype float32 --output guided_float32.json > guided_float32.log 2>&1
echo done > DONE

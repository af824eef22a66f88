#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# The first device run of this part (2026-11-28): where a batch-1 step's host time goes, and cuBLAS
# against the skinny-GEMM kernel's configs for the decode projections. Carries .whl (the wheels the
# image lacks) and .stage/tok (SmolLM2's tokenizer and config: the GGUF does not travel).
T0=$SECONDS
exec > >(tee $OUT/job.log) 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
ln -sfn $PWD /tmp/site/specexec
export PYTHONPATH=/tmp/site SPECEXEC_CACHE_DIR=/tmp/cache
R=bench/reports/2026-11-28-gpu-step
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
lscpu | grep -E "Model name|^CPU\(s\)"
echo "setup at $((SECONDS-T0)) s"
timeout 110 python3 $R/host_profile.py --tokenizer-dir .stage/tok --max-tokens 128 > $OUT/host_profile.txt 2>&1
echo "host_profile rc=$? at $((SECONDS-T0)) s"; head -25 $OUT/host_profile.txt
timeout 170 python3 $R/skinny_tune.py --output $OUT/skinny_tune.json > $OUT/skinny_tune.txt 2>&1
echo "skinny_tune rc=$? at $((SECONDS-T0)) s"; grep -E "m=" $OUT/skinny_tune.txt

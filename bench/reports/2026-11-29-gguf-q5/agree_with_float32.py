"""Greedy chat outputs of the Q5_K_M file against the file in float32 (dense, quantization null): the first
token where each setting differs from float32, per prompt. python bench/reports/2026-11-29-gguf-q5/agree_with_float32.py"""

from specexec import Executor, ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.layers.quantized import quantization
from specexec.sampling import SamplingParams

path = "/opt/gguf/smollm2-135m-instruct-q5_k_m.gguf"
ref = Executor(config=ExecutorConfig(model=path, dtype="float32", progress=False))
codes32 = Executor(config=ExecutorConfig(model=path, quantization="gguf", dtype="float32", progress=False))
codes = Executor(config=ExecutorConfig(model=path, quantization="gguf", dtype="bfloat16", progress=False))
quantization.INT8_BLOCK_TYPES = ("Q8_0", "Q5_0", "Q6_K")
dense = Executor(config=ExecutorConfig(model=path, quantization="gguf", dtype="bfloat16", progress=False))
chats = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


for text in chats:
    ids = ref.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = list(ids if isinstance(ids, list) else ids["input_ids"])
    outs = {
        n: ex.run([Request(ids, SamplingParams(max_tokens=48))])[0].token_ids
        for n, ex in (("ref", ref), ("codes32", codes32), ("codes", codes), ("dense", dense))
    }
    print({n: first_diff(outs["ref"], o) for n, o in outs.items() if n != "ref"}, len(outs["ref"]))

"""How close each kernel and dtype stays to the GGUF's exact model: greedy outputs and top-1 agreement
against the GGUF dequantized to a dense float32 model (the file's weights exactly, as
`tests/model/test_gguf_quantization_smollm2.py` checks; torch's float32 int4 path computes the same products
but ~10x slower), on chat prompts.

    python bench/reports/2026-11-27-int8-dot/match_rate.py [--num-prompts 20] [--max-tokens 48]

Top-1 agreement: the reference's own greedy answers fed back (the prompt, then the answer in one
forward), the share of answer positions where each setting's argmax equals the reference's next token.
"""

from __future__ import annotations

import argparse

import torch
from specexec import Executor, ExecutorConfig, SamplingParams
from specexec.executor.engine.inputs import tokenize_prompt
from specexec.executor.model.forward_io import SequenceInput
from specexec.prompt_sets.datasets import load_dataset

SETTINGS = {  # name: (dtype, quantized_kernel); None: the dense float32 model, the reference
    "dense float32 (the reference)": ("float32", None),
    "bfloat16, torch": ("bfloat16", "torch"),
    "bfloat16, auto": ("bfloat16", "auto"),
    "float32, int8_dot": ("float32", "int8_dot"),
    "bfloat16, int8_dot": ("bfloat16", "int8_dot"),
}


def chat_prompts(n: int) -> list[list[dict]]:
    return [p.messages for p in load_dataset("specbench", n)]


@torch.inference_mode()
def top1(executor: Executor, prompts, answers) -> tuple[int, int]:
    runner, bm, tok = executor.core.runner, executor.block_manager, executor.tokenizer
    same = total = 0
    for prompt, answer in zip(prompts, answers):
        ids = tokenize_prompt(prompt, tok, executor.core.vocab_size)  # as the executor tokenizes it
        bm.allocate("m", len(ids) + len(answer) + 1)
        runner.forward([SequenceInput(ids, 0, bm.block_tables["m"], 1)])
        # the answer in one forward of its own (under 128 rows: the decode/verify kernels, not the dense
        # prefill path); row j predicts the token after answer[j]
        table = bm.block_tables["m"]
        logits = runner.forward([SequenceInput(answer, len(ids), table, len(answer))]).logits
        bm.free("m")
        predicted = logits.argmax(-1).tolist()  # [len(answer)]
        want = answer[1:] + [None]
        same += sum(p == w for p, w in zip(predicted, want) if w is not None)
        total += len(answer) - 1
    return same, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    prompts = chat_prompts(args.num_prompts)
    params = SamplingParams(max_tokens=args.max_tokens)
    reference = None
    print(f"{'setting':32s} identical  first divergence (median)  top-1 agreement")
    for name, (dtype, kernel) in SETTINGS.items():
        config = ExecutorConfig(
            quantization=None if kernel is None else "gguf",
            dtype=dtype,
            quantized_kernel=kernel or "auto",
            progress=False,
            num_kv_blocks=256,
        )
        with Executor(config=config) as executor:
            outputs = [o.token_ids for o in executor.run(prompts, params)]
            if reference is None:
                reference = outputs
            same, total = top1(executor, prompts, reference)
        identical = sum(a == b for a, b in zip(outputs, reference))
        diverge = sorted(
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            for a, b in zip(outputs, reference)
        )
        print(
            f"{name:32s} {identical:3d}/{len(prompts):<5d} {diverge[len(diverge) // 2]:>10d}"
            f"                {same / total:.2%}"
        )


if __name__ == "__main__":
    main()

"""How faithful and how large each ``quantization`` setting is, against the float32 copy of the model.

    python -m specexec.bench.quantization_report [--settings gguf:float32,gguf:auto,int8:auto,int4:auto]
        [--max-tokens 48] [--output quant.json]

For each setting, in a fresh process (so resident memory is the executor's own):
- *resident memory* after ``Executor(config)`` (VmRSS, after ``malloc_trim``) and its peak while
  loading (VmHWM), in MiB, beside the model's weight bytes and the KV pool's (1 GiB by default);
- *greedy match*: the share of the 20 chat prompts of the end-to-end test whose greedy output equals
  the float32 copy's (the same executor, dense float32 weights), token for token;
- *top-1 agreement*: teacher-forced on the float32 copy's outputs, the share of positions where the
  setting's most likely next token is the float32 copy's (one plain forward per prompt).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys

from ..executor.layers.cpu_info import describe_cpu

PROMPTS = [  # tests/executor/test_smollm2_end_to_end.py
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.",
    "Write a short motivational quote.",
    "What are the benefits of regular exercise?",
    "Explain what a neural network is to a child.",
    "Name five countries in Africa.",
    "How does a bicycle stay upright?",
    "Write the opening line of a mystery novel.",
    "What is the difference between weather and climate?",
    "Suggest a name for a pet goldfish.",
]
DEFAULT_SETTINGS = "none:float32,none:bfloat16,gguf:float32,gguf:auto,int8:auto,int4:auto"


def _memory_mib() -> dict[str, float]:
    """VmRSS after handing freed heap back to the OS (glibc keeps what loading freed otherwise)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def measure_setting(quantization: str | None, dtype: str, max_tokens: int, reference: list[list[int]] | None):
    """In this process: load, measure memory, generate, and (given the reference) count agreement."""
    import torch

    from ..executor.config import ExecutorConfig
    from ..executor.executor import Executor
    from ..executor.model.model_loader import load_model
    from ..sampling import SamplingParams

    executor = Executor(config=ExecutorConfig(quantization=quantization, dtype=dtype))
    memory = _memory_mib()
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = executor.run(chats, SamplingParams(max_tokens=max_tokens))
    result = {
        "quantization": quantization,
        "dtype": executor.setup.dtype_choice.dtype,
        "layers": dict(executor.setup.quantization.layers) if executor.setup.quantization else None,
        "rss_mib": memory["VmRSS"],
        "weights_mib": _tensor_bytes(executor.model) / 2**20,
        "kv_pool_mib": executor.kv_cache_bytes / 2**20,
        "peak_rss_mib": memory["VmHWM"],
        "prompt_ids": [o.prompt_token_ids for o in outputs],
        "outputs": [o.token_ids for o in outputs],
    }
    if reference is not None:
        del executor
        model = load_model(None, dtype=result["dtype"], quantization=quantization, progress=False).model
        agree = total = 0
        with torch.inference_mode():
            for prompt, want in zip(result["prompt_ids"], reference):
                ids = torch.tensor([prompt + want])
                predicted = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1)  # [len(want)]
                agree += int((predicted == torch.tensor(want)).sum())
                total += len(want)
        result["greedy_match"] = sum(o == r for o, r in zip(result["outputs"], reference)) / len(PROMPTS)
        result["top1_agreement"] = agree / total
    return result


def _tensor_bytes(model) -> int:
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _run_child(setting: str, max_tokens: int, reference) -> dict:
    """One setting in a fresh interpreter (its memory figures are its own)."""
    payload = json.dumps({"setting": setting, "max_tokens": max_tokens, "reference": reference})
    proc = subprocess.run(
        [sys.executable, "-m", "specexec.bench.quantization_report", "--child"],
        input=payload,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"setting {setting} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _parse(setting: str) -> tuple[str | None, str]:
    quantization, _, dtype = setting.partition(":")
    return (None if quantization == "none" else quantization), dtype or "auto"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specexec.bench.quantization_report")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS, help="quantization:dtype, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--output", help="write the rows (and the outputs) to this JSON file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        job = json.loads(sys.stdin.read())
        result = measure_setting(*_parse(job["setting"]), job["max_tokens"], job["reference"])
        print(json.dumps(result))
        return 0
    reference = _run_child("none:float32", args.max_tokens, None)["outputs"]
    rows = []
    head = ("setting", "dtype", "RSS MiB", "peak MiB", "weights MiB", "KV pool MiB", "greedy match", "top-1")
    print("{:18} {:9} {:>8} {:>9} {:>12} {:>12} {:>13} {:>7}".format(*head))
    for setting in args.settings.split(","):
        row = _run_child(setting, args.max_tokens, reference)
        row["setting"] = setting
        rows.append(row)
        print(
            f"{setting:18} {row['dtype']:9} {row['rss_mib']:8.0f} {row['peak_rss_mib']:9.0f} "
            f"{row['weights_mib']:12.0f} {row['kv_pool_mib']:12.0f} "
            f"{row['greedy_match']:12.0%} {row['top1_agreement']:7.2%}",
            flush=True,
        )
    print(f"CPU: {describe_cpu()}; {len(PROMPTS)} chat prompts, {args.max_tokens} tokens each, greedy")
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"cpu": describe_cpu(), "max_tokens": args.max_tokens, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

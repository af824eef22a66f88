"""What the `specexec bench` tests feed it: a small dataset, the command line over a tiny model, and a
tiny model with two stop ids that differ (as Llama-3's EOS and ``<|eot_id|>`` do)."""

from __future__ import annotations

import json

import torch
from tiny_models import make_tiny_model, make_tiny_tokenizer

TOKENIZER_EOS = 5  #: "<|end|>"
CONFIG_EOS = 4  #: "<|tool|>", the generation config's own stop id
OFTEN_PICKED = 39  #: a token greedy decoding picks early in each of the bench prompts


def write_dataset(path, n: int = 3) -> str:
    """Repetitive prompts in the tiny tokenizer's words (so prompt lookup finds matches)."""
    lines = [{"id": f"p{i}", "prompt": " ".join(f"w{(i + j) % 5}" for j in range(12))} for i in range(n)]
    lines[0]["schema"] = {"type": "object"}
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


def write_conversations(path, n: int = 2) -> str:
    """n conversations of three user turns in the tiny tokenizer's words."""
    lines = [
        {"id": f"c{i}", "turns": [" ".join(f"w{(i + t + j) % 5}" for j in range(12)) for t in range(3)]}
        for i in range(n)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


def bench_argv(tiny_dir, tmp_path, *extra: str) -> list[str]:
    return [
        "bench",
        "--model",
        tiny_dir,
        "--dataset",
        write_dataset(tmp_path / "prompts.jsonl"),
        "--num-requests",
        "3",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--output",
        str(tmp_path / "r.json"),
        *extra,
    ]


def save_tiny_dir_with_two_stop_ids(path) -> str:
    """The tiny Llama whose head row of CONFIG_EOS is twice OFTEN_PICKED's, so it wins wherever that token
    would (a positive logit): each prompt meets a stop token within its first tokens."""
    _, model = make_tiny_model("llama", dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight[CONFIG_EOS] = 2 * model.lm_head.weight[OFTEN_PICKED]
    model.generation_config.eos_token_id = [CONFIG_EOS]
    model.save_pretrained(path)
    tokenizer = make_tiny_tokenizer()
    tokenizer.eos_token = "<|end|>"
    tokenizer.save_pretrained(path)
    return str(path)

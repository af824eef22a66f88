"""Tensor-parallel runs on CPU (gloo) of the float64 tiny models, and their worker processes.

- `generate`: the tokens of `PROMPTS` under ``tp`` ranks, every request checked and every page free;
- `UNEVEN`, `INT4_SHAPES`: model shapes whose KV heads split unevenly, and whose int4 groups split whole;
- `running`, `no_workers_left`: whether a worker process is still alive.
"""

from __future__ import annotations

import time

from factories import assert_all_pages_free, drafting_config
from specexec import Executor, Request, SamplingParams
from tiny_models import make_prompts, make_tiny_model

PROMPTS = make_prompts(4, [9, 23, 5, 40], seed=7) + [[5, 6, 7] * 8]
#: 3 KV heads (2 query heads each): 2 ranks hold 2 and 1 of them
UNEVEN = {"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 48}
#: int4 needs whole groups of 32 inputs in each rank's o_proj and down_proj columns
INT4_SHAPES = {"hidden_size": 64, "head_dim": 32, "intermediate_size": 128}


def generate(arch: str, tp: int, spec=None, model_overrides=None, **overrides) -> list[list[int]]:
    _, model = make_tiny_model(arch, **(model_overrides or {}))
    config = drafting_config(speculative_config=spec, tensor_parallel_size=tp, max_num_tokens=32, **overrides)
    with Executor(model, config) as executor:
        outputs = executor.run([Request(p, SamplingParams(max_tokens=10, ignore_eos=True)) for p in PROMPTS])
        assert all(o.error is None for o in outputs), [o.error for o in outputs]
        assert_all_pages_free(executor)
        if spec is not None:
            assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    return [o.token_ids for o in outputs]


def running(pid: int) -> bool:
    """Whether the process exists and has not exited (a zombie waiting to be reaped has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def no_workers_left(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True

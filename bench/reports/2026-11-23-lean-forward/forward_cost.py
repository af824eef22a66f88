"""Goal 2 of issue 12, measured side by side: one target forward over n new tokens after 1,024 cached
ones (the executor's own forward on its paged cache), n = 1 and 4 alternated, against HF's own forward
of one token on a DynamicCache of 1,024 tokens (same weights, same dtype, SDPA). Medians of 30.

    python bench/reports/2026-11-23-lean-forward/forward_cost.py bfloat16
"""

import statistics
import sys
import time

import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.executor.model.model_loader import load_model

CONTEXT, REPEATS = 1024, 30


def main(dtype: str) -> None:
    torch.set_grad_enabled(False)
    executor = Executor(config=ExecutorConfig(dtype=dtype))
    hf = load_model(None, dtype=dtype, progress=False).model.eval()
    ids = torch.randint(100, 10_000, (1, CONTEXT))
    out = hf(input_ids=ids, use_cache=True)
    cache = out.past_key_values

    def hf_one() -> None:
        hf(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
        cache.crop(-1)  # back to 1,024 cached tokens

    times: dict[str, list[float]] = {"1": [], "4": [], "hf 1": []}
    for _ in range(3):  # warm-up
        executor.time_forward(1, CONTEXT), executor.time_forward(4, CONTEXT), hf_one()
    for _ in range(REPEATS):
        for name, fn in (
            ("1", lambda: executor.time_forward(1, CONTEXT)),
            ("4", lambda: executor.time_forward(4, CONTEXT)),
            ("hf 1", hf_one),
        ):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(
        f"{dtype}, {CONTEXT} cached tokens: specexec 1 token {med['1']:.1f} ms, 4 tokens {med['4']:.1f} ms "
        f"({med['4'] / med['1']:.2f}x); HF forward of 1 token {med['hf 1']:.1f} ms "
        f"(specexec/HF {med['1'] / med['hf 1']:.2f})"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bfloat16")

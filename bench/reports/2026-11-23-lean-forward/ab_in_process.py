"""Before and after executors in one process, their steps alternated, so this host's drifting speed
falls on both alike. Prints the median step time of each for batch 1, batch 8, and batch 8 with 3
drafts each (a drafter that always proposes 3 tokens).

    python ab_in_process.py BEFORE_PARENT DTYPE DATASET

BEFORE_PARENT is a folder holding ``specexec_before``, a link to the before tree (7955c0a here, its
attention function registered as "specexec_paged_before" so that it does not replace ours).
"""

import importlib
import statistics
import sys
import time

import torch
from specexec.prompt_sets.datasets import load_dataset

SCENARIOS = ((1, 0), (8, 0), (8, 3))  # (requests, drafts per request)
STEPS = 16


def build(package: str, dtype: str, batch: int, num_drafts: int, dataset: str):
    """An executor of ``package`` with ``batch`` requests past their prefill and 3 warm-up steps."""
    config = importlib.import_module(package + ".executor.config")
    executor_module = importlib.import_module(package + ".executor.executor")
    request = importlib.import_module(package + ".executor.request")
    sampling = importlib.import_module(package + ".sampling")
    base = importlib.import_module(package + ".drafters.base")
    drafter = None
    if num_drafts:

        class Fixed(base.Drafter):
            runs_on_loop_thread = True

            def propose(self, request, num_slots, resources):
                return base.DraftProposal([request.token_ids[-1]] * num_slots)

        drafter = Fixed(num_drafts)
    settings = config.ExecutorConfig(dtype=dtype, max_batch_size=batch, max_num_tokens=4096)
    executor = executor_module.Executor(config=settings, drafter=drafter)
    tokenizer = executor.tokenizer
    states = []
    for i, prompt in enumerate(load_dataset(dataset, batch)):
        ids = tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        params = sampling.SamplingParams(max_tokens=10_000, ignore_eos=True)
        states.append(executor.add_request(request.Request(list(ids), params, f"p{i}")))
    while any(not s.num_output_tokens for s in states):
        executor.step()
    for _ in range(3):
        executor.step()
    return executor


def main(before_parent: str, dtype: str, dataset: str) -> None:
    sys.path.insert(0, before_parent)
    torch.set_grad_enabled(False)
    for batch, k in SCENARIOS:
        executors = {
            "before": build("specexec_before", dtype, batch, k, dataset),
            "after": build("specexec", dtype, batch, k, dataset),
        }
        walls: dict[str, list[float]] = {name: [] for name in executors}
        for _ in range(STEPS):
            for name, executor in executors.items():
                start = time.perf_counter()
                executor.step()
                walls[name].append(time.perf_counter() - start)
        before, after = (statistics.median(walls[n]) * 1e3 for n in ("before", "after"))
        print(
            f"{dtype} {dataset} batch {batch} k={k}: before {before:.1f} ms, after {after:.1f} ms, "
            f"after/before {after / before:.2f}",
            flush=True,
        )
        for executor in executors.values():
            executor.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])

"""The bundled prompts a training may answer: those no benchmark draw can pick.

`specexec bench` takes ``spread(prompts, n)`` of a dataset (or of one Spec-Bench category): the first n
of a fixed order, so every draw of up to `MAX_BENCH_REQUESTS` requests per dataset (and
`MAX_BENCH_REQUESTS_PER_CATEGORY` per Spec-Bench category) lies inside one held-out set. Training uses
only the prompts outside it, so a trained head is never scored on a prompt it was trained on.
"""

from __future__ import annotations

from ...prompt_sets.datasets import JSONSCHEMABENCH_SPLITS, BenchPrompt, load_dataset, spread

#: the largest benchmark draw the held-out set covers, per dataset / per Spec-Bench category
MAX_BENCH_REQUESTS = 64
MAX_BENCH_REQUESTS_PER_CATEGORY = 16
SPECBENCH_CATEGORIES = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
]
#: (dataset, weight): each round of the interleave takes `weight` prompts of each dataset; open chat
#: (Spec-Bench) and document extraction (a benchmark set of its own, long prompts) get the largest
#: shares, the other JSON tasks the rest
TRAINING_DATASETS: tuple[tuple[str, int], ...] = (
    ("specbench", 4),
    ("extraction", 4),
    *((f"jsonschemabench:{s}", 1) for s in JSONSCHEMABENCH_SPLITS),
    ("bfcl", 1),
    ("humaneval", 1),
)


def bench_prompt_ids(dataset: str) -> set[str]:
    """Every prompt id a benchmark draw of at most the held-out sizes can pick from ``dataset``."""
    groups = [(load_dataset(dataset), MAX_BENCH_REQUESTS)]
    if dataset == "specbench":
        groups += [
            (load_dataset(f"specbench:{c}"), MAX_BENCH_REQUESTS_PER_CATEGORY) for c in SPECBENCH_CATEGORIES
        ]
    return {p.id for prompts, most in groups for p in spread(prompts, most)}


def training_prompts(datasets: tuple[tuple[str, int], ...] = TRAINING_DATASETS) -> list[BenchPrompt]:
    """The prompts no benchmark draw reaches, interleaved across datasets by weight (so any prefix of
    the list is a mix)."""
    pools = []
    for name, weight in datasets:
        held_out = bench_prompt_ids(name)
        pools.append(([p for p in load_dataset(name) if p.id not in held_out], weight))
    mixed: list[BenchPrompt] = []
    for i in range(max(len(pool) // weight + 1 for pool, weight in pools)):
        for pool, weight in pools:
            mixed += pool[i * weight : (i + 1) * weight]
    return mixed

"""Two variants of the lookup index with the chosen rule (match >= 2, bar 0.5): the newest occurrence
instead of the first, and keys of up to 5 tokens instead of 3; acceptance length on the evaluation's first
24 prompts per set (greedy, k=3, 128 tokens). Output: variants.txt.

    python bench/reports/2026-11-26-eagle3-prompt-lookup/variants.py
"""

from specexec.bench.engines.specexec_hf import Workload, chat_token_ids, run_specexec
from specexec.bench.records import summarize
from specexec.drafters.ngram import NGramConfig, NGramDrafter
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.prompt_sets.datasets import load_dataset

ex = Executor(
    config=ExecutorConfig(
        speculative_config={"decoding_type": "Eagle", "max_draft_len": 3}, progress=False, warmup=True
    )
)
d = ex.speculation.drafter
variants = {
    "newest": NGramConfig(3, is_public_pool=False, is_use_oldest=False),
    "keys<=5": NGramConfig(3, max_matching_ngram_size=5, is_public_pool=False),
}
tok = ex.tokenizer
for name in ("specbench", "extraction"):
    prompts = load_dataset(name, 24)
    ids = chat_token_ids(tok, prompts)
    work = Workload(prompts, ids, 128, 0.0)
    for label, cfg in variants.items():
        d.lookup = NGramDrafter(cfg)
        recs, wall = run_specexec(ex, work, 1)
        row = summarize(label, 1, recs, wall)
        print(name, label, f"acc.len {row['mean_acceptance_length']:.3f}", flush=True)

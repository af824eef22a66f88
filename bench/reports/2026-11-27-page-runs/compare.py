"""The block manager's page rule, side by side: a request takes the page after its last one when it is
free (now), against the pool's oldest free page (before). Batch 1, greedy, 128 tokens, engines taking
turns prompt by prompt (`eagle3_eval.run_interleaved_records`), on held-out Spec-Bench and extraction
prompts, every engine on ``cpu_linear: auto``.

    python bench/reports/2026-11-27-page-runs/compare.py --num-requests 24 --output DIR

Engines: no drafts; EAGLE-3 (the shipped head with prompt lookup, k=3) and NGram (k=3), each with the
page rule of now and, as "oldest page", with the rule of before put back on its block managers (the
target's and the drafter's own). Without drafts nothing is rewound, so both rules give the same pages.
Also counted: the verify forwards whose lone request was on consecutive pages (attended as one view of
the pool) against those whose pages had to be gathered.
"""

import types

from specexec.bench.eagle3_eval import machine_line, save_side_by_side, side_by_side, side_by_side_arguments
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.executor.model import attention_metadata

#: the head dense, as it ran for this report (before ``head_quantization`` existed)
EAGLE3 = {"decoding_type": "Eagle", "max_draft_len": 3, "head_quantization": None}
NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}
ENGINES = {  # label: (speculative_config, the rule of before)
    "none": (None, False),
    "eagle3": (EAGLE3, False),
    "eagle3 oldest page": (EAGLE3, True),
    "ngram": (NGRAM, False),
    "ngram oldest page": (NGRAM, True),
}


def oldest_free_page(self, table):
    """The rule of before: always the pool's oldest free page."""
    while (page := self._free_order.popleft()) not in self._free:
        pass
    self._free.remove(page)
    return page


def count_views(counts: dict[str, dict[str, int]], owners: dict[int, str]):
    """Wrap AttentionMetadata.build to count each engine's lone-request forwards of several tokens after
    the prompt (verifies, and catch-ups of the drafter) by whether they were a view or gathered."""
    build = attention_metadata.AttentionMetadata.build.__func__

    def counting(cls, kv_cache, slot_mapping, seqs, block_size, paths=None):
        meta = build(cls, kv_cache, slot_mapping, seqs, block_size, paths)
        owner = owners.get(id(kv_cache))
        if owner is not None and len(seqs) == 1 and seqs[0].query_len > 1 and seqs[0].start_pos > 0:
            counts[owner]["view" if meta.groups[0].kv_slice is not None else "gathered"] += 1
        return meta

    attention_metadata.AttentionMetadata.build = classmethod(counting)


def main() -> None:
    args = side_by_side_arguments()

    engines = {}
    for label, (spec, before) in ENGINES.items():
        config = ExecutorConfig(speculative_config=spec, cpu_linear="auto", progress=False, warmup=True)
        engines[label] = Executor(config=config)
        if before:
            drafter = engines[label].speculation.drafter
            for bm in (engines[label].block_manager, getattr(drafter, "block_manager", None)):
                if bm is not None:
                    bm._take_page = types.MethodType(oldest_free_page, bm)
    counts = {label: {"view": 0, "gathered": 0} for label in engines}
    count_views(counts, {id(e.core.runner.kv_cache): label for label, e in engines.items()})  # targets'
    report = {"machine": machine_line(engines["eagle3"])}
    report["kernels"] = {label: e.linear_backend.backend for label, e in engines.items()}
    lines = [f"machine: {report['machine']}", f"kernels: {report['kernels']}", ""]
    report["sets"], tables = side_by_side(engines, args.num_requests, args.max_tokens)
    lines += tables
    report["verify_forwards"] = counts
    lines.append("target forwards of one request, several tokens, after its prompt: view / gathered")
    lines += [f"  {label}: {c['view']} / {c['gathered']}" for label, c in counts.items()]
    save_side_by_side(report, lines, args.output)
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()

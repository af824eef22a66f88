"""EAGLE-3 with the head as ``head_quantization: auto`` chooses on this machine, against the head dense,
side by side: batch 1, greedy, 128 tokens, engines taking turns prompt by prompt, on held-out Spec-Bench
and extraction prompts (`eagle3_eval.side_by_side`). Every engine on the executor's defaults
(``cpu_linear: auto``, prompt lookup on) but for the settings its label names.

    python bench/reports/2026-11-27-int8-head/compare.py --num-requests 24 --output DIR
"""

from specexec.bench.eagle3_eval import compare_speculative_configs

EAGLE3 = {"decoding_type": "Eagle", "max_draft_len": 3}
ENGINES = {  # label: speculative_config
    "none": None,
    "eagle3 k=3": EAGLE3,
    "eagle3 k=3 dense head": {**EAGLE3, "head_quantization": None},
    "eagle3 k=2": {**EAGLE3, "max_draft_len": 2},
    "ngram k=3": {"decoding_type": "NGram", "max_draft_len": 3},
}


if __name__ == "__main__":
    compare_speculative_configs(ENGINES, description=__doc__.split("\n\n")[0])

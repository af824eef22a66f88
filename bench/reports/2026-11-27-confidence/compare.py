"""EAGLE-3's draft length chosen per token by the head's confidence (``draft_len_policy: confidence``)
against the default per-request policy, side by side: batch 1, greedy, 128 tokens, engines taking turns
prompt by prompt, on held-out Spec-Bench and extraction prompts (`eagle3_eval.side_by_side`). Every
engine on the executor's defaults (``cpu_linear: auto``, ``head_quantization: auto``, prompt lookup on)
but for the settings its label names.

    python bench/reports/2026-11-27-confidence/compare.py --num-requests 24 --output DIR
"""

from specexec.bench.eagle3_eval import compare_speculative_configs

EAGLE3 = {"decoding_type": "Eagle", "max_draft_len": 3}
ENGINES = {  # label: speculative_config
    "none": None,
    "eagle3 k=3": EAGLE3,
    "eagle3 k=3 confidence": {**EAGLE3, "draft_len_policy": "confidence"},
    "eagle3 k=5 confidence": {**EAGLE3, "max_draft_len": 5, "draft_len_policy": "confidence"},
    "eagle3 k=2": {**EAGLE3, "max_draft_len": 2},
}


if __name__ == "__main__":
    compare_speculative_configs(ENGINES, description=__doc__.split("\n\n")[0])

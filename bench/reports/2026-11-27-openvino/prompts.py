"""Write the Spec-Bench prompts `specexec bench --dataset specbench --num-requests N` runs, as the token
ids it gives every engine (the chat template rendered by SmolLM2's tokenizer), for `ov_bench.py`.

    python bench/reports/2026-11-27-openvino/prompts.py 8 > /tmp/ovwork/prompts.json
"""

from __future__ import annotations

import json
import sys

from specexec.bench.engines.specexec_hf import chat_token_ids
from specexec.executor.model.model_loader import load_model
from specexec.prompt_sets.datasets import load_dataset

num = int(sys.argv[1]) if len(sys.argv) > 1 else 8
prompts = load_dataset("specbench", num)
tokenizer = load_model(None, dtype="float32", device="cpu", progress=False).tokenizer
ids = chat_token_ids(tokenizer, prompts)
json.dump([{"id": p.id, "token_ids": t} for p, t in zip(prompts, ids)], sys.stdout)

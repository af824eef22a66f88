"""Guided decoding on the real model over a JSONSchemaBench sample: every finished output validates."""

from __future__ import annotations

import json

import jsonschema
import pytest
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from specexec.executor.model.model_loader import load_model
from specexec.prompt_sets.datasets import JSONSCHEMABENCH_SPLITS, load_dataset

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("all_threads")]
SCHEMAS_PER_SPLIT = 2
CONFIGS = {
    "none": None,
    "ngram": {"decoding_type": "NGram", "max_draft_len": 4},
    # token trees, each node's row masked after its path (the int8 self-draft's guided drafting is
    # checked on the tiny models of test_guided_decoding.py)
    "ngram-tree": {"decoding_type": "NGram", "max_draft_len": 4, "draft_tree": True},
}


@pytest.fixture(scope="module")
def smollm2():
    return load_model(None, dtype="float32", progress=False)


def jsonschemabench_requests(temperature: float) -> list[Request]:
    prompts = [
        p
        for split in JSONSCHEMABENCH_SPLITS
        for p in load_dataset(f"jsonschemabench:{split}", SCHEMAS_PER_SPLIT)
    ]
    return [
        Request(
            p.messages,
            SamplingParams(max_tokens=200, temperature=temperature, seed=i),
            request_id=p.id,
            response_format={"type": "json_schema", "json_schema": {"schema": p.schema}},
        )
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_finished_outputs_validate_on_jsonschemabench_sample(smollm2, config_name, temperature):
    config = ExecutorConfig(speculative_config=CONFIGS[config_name], max_batch_size=16)
    executor = Executor(smollm2.model, config, tokenizer=smollm2.tokenizer)
    requests = jsonschemabench_requests(temperature)
    outputs = executor.run(requests)
    finished = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    uncompilable = [o.request_id for o in outputs if o.finish_reason is FinishReason.ERROR]
    print(
        f"{config_name} T={temperature}: {len(finished)}/{len(outputs)} finished, cannot compile: {uncompilable}"
    )
    assert len(finished) >= len(outputs) // 2
    by_id = {r.request_id: r for r in requests}
    for out in finished:
        schema = by_id[out.request_id].response_format["json_schema"]["schema"]
        jsonschema.validate(json.loads(out.text), schema)
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks

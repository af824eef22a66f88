"""Property-based tests of the whole loop (hypothesis, derandomized, a fixed number of examples).

Random streams of requests (prompts, sampling parameters, aborts, stream or run, one or two threads)
run through executors with random drafters and tiny KV pools that force preemption, on a float64 tiny
model; guided streams add schemas and regexes. Invariants: greedy outputs equal the same request run
alone without drafts; aborted requests end with "abort"; every KV page is free afterwards; every
finished guided output is valid (checked by jsonschema / re, and said so on the output).
"""

from __future__ import annotations

import functools
import json
import re
import threading

import jsonschema
import torch
from grammar_support import smollm2_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from specexec.drafters import Drafter, DraftProposal
from specexec.drafters.ngram import NGramDrafter
from tiny_models import make_tiny_model

#: examples per property: enough to cover the drafters x pools x threads matrix, a few seconds each
MAX_EXAMPLES = 30
GUIDED_EXAMPLES = 12
SETTINGS = dict(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VOCAB = 256


class GarbageDrafter(Drafter):
    """Proposes random ids, sometimes out of the vocabulary, sometimes with a broken q."""

    def __init__(self, max_draft_len: int = 3) -> None:
        super().__init__(max_draft_len)
        self.gen = torch.Generator().manual_seed(0)

    def propose(self, request, num_slots, resources):
        tokens = torch.randint(0, VOCAB + 3, (num_slots,), generator=self.gen).tolist()
        if torch.rand(1, generator=self.gen).item() < 0.3:
            return DraftProposal(tokens, probs=torch.full((num_slots, VOCAB), float("nan")))
        return DraftProposal(tokens)


DRAFTERS = {
    "none": lambda: None,
    "ngram": lambda: NGramDrafter(max_draft_len=3, max_matching_ngram_size=2),
    "garbage": lambda: GarbageDrafter(3),
}


@functools.cache
def alone(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    """Greedy output of one request alone, without drafts, in a roomy pool."""
    _, model = make_tiny_model("llama")
    executor = Executor(model, ExecutorConfig(num_kv_blocks=64, block_size=4, dtype="float64", device="cpu"))
    (out,) = executor.run([Request(list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))])
    return out.token_ids


request_st = st.fixed_dictionaries(
    {
        "prompt": st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=16),
        "max_tokens": st.integers(1, 12),
        "sampled": st.booleans(),
        "abort_after": st.one_of(st.none(), st.integers(0, 6)),  #: events seen before abort_request
        "thread": st.integers(0, 1),
    }
)


@settings(max_examples=MAX_EXAMPLES, **SETTINGS)
@given(
    requests=st.lists(request_st, min_size=1, max_size=8),
    drafter=st.sampled_from(sorted(DRAFTERS)),
    num_kv_blocks=st.integers(8, 24),
    use_stream=st.booleans(),
)
def test_random_request_streams_keep_the_invariants(requests, drafter, num_kv_blocks, use_stream):
    _, model = make_tiny_model("llama")
    config = ExecutorConfig(
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        max_num_tokens=64,
        max_batch_size=6,
        dtype="float64",
        device="cpu",
    )
    executor = Executor(model, config, drafter=DRAFTERS[drafter]())
    made = [
        Request(
            r["prompt"],
            SamplingParams(
                max_tokens=r["max_tokens"], temperature=0.8 if r["sampled"] else 0.0, seed=i, ignore_eos=True
            ),
            f"r{i}",
        )
        for i, r in enumerate(requests)
    ]
    outputs: dict[str, object] = {}
    errors: list[BaseException] = []

    def run_thread(indices):
        try:
            for out in executor.run([made[i] for i in indices]):
                outputs[out.request_id] = out
        except BaseException as exc:
            errors.append(exc)

    second = [i for i, r in enumerate(requests) if r["thread"] == 1]
    worker = threading.Thread(target=run_thread, args=(second,))
    worker.start()
    first = [i for i, r in enumerate(requests) if r["thread"] == 0]
    if use_stream:
        seen: dict[str, int] = {}
        for event in executor.stream([made[i] for i in first]):
            seen[event.request_id] = seen.get(event.request_id, 0) + 1
            limit = requests[int(event.request_id[1:])]["abort_after"]
            if not event.finished and limit is not None and seen[event.request_id] > limit:
                executor.abort_request(event.request_id)  # (False if it finished meanwhile)
            if event.finished:
                outputs[event.request_id] = event.output
    else:
        run_thread(first)
    worker.join(120)
    assert not errors, errors

    for i, r in enumerate(requests):
        out = outputs[f"r{i}"]
        assert out.finish_reason in (FinishReason.LENGTH, FinishReason.ABORT), out.error
        assert all(0 <= t < VOCAB for t in out.token_ids) and len(out.token_ids) <= r["max_tokens"]
        if out.finish_reason is FinishReason.LENGTH and not r["sampled"]:
            assert out.token_ids == alone(tuple(r["prompt"]), r["max_tokens"])
        if out.finish_reason is FinishReason.ABORT:
            assert use_stream and i in first and r["abort_after"] is not None
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.block_tables
    assert not executor.core.has_unfinished()


# ---- guided streams ------------------------------------------------------------------------------------
SCHEMAS = [
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
        "required": ["a"],
    },
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    {
        "type": "object",
        "properties": {"k": {"enum": ["x", "y"]}},
        "required": ["k"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["b"],
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    },
]
REGEXES = [r"(yes|no)", r"[0-9]{1,4}", r"[a-c]+-[0-9]"]


@functools.cache
def guided_model():
    return make_tiny_model("llama", vocab_size=49152)[1]


guided_request_st = st.fixed_dictionaries(
    {
        "grammar": st.one_of(
            st.sampled_from(range(len(SCHEMAS))), st.sampled_from([f"re{i}" for i in range(len(REGEXES))])
        ),
        "temperature": st.sampled_from([0.0, 1.0]),
        "max_tokens": st.integers(4, 40),
        "seed": st.integers(0, 1000),
    }
)


@settings(max_examples=GUIDED_EXAMPLES, **SETTINGS)
@given(
    requests=st.lists(guided_request_st, min_size=1, max_size=6),
    drafter=st.sampled_from(["none", "ngram"]),
    num_kv_blocks=st.integers(16, 64),
)
def test_every_finished_guided_output_is_valid_and_says_so(requests, drafter, num_kv_blocks):
    config = ExecutorConfig(
        num_kv_blocks=num_kv_blocks,
        block_size=8,
        dtype="float64",
        device="cpu",
        guided_json_max_whitespace=0,
        speculative_config={"decoding_type": "NGram", "max_draft_len": 3} if drafter == "ngram" else None,
    )
    import copy

    executor = Executor(copy.deepcopy(guided_model()), config, tokenizer=smollm2_tokenizer())
    made = []
    for r in requests:
        g = r["grammar"]
        fmt = (
            {"type": "regex", "regex": REGEXES[int(g[2:])]}
            if isinstance(g, str)
            else {"type": "json_schema", "json_schema": {"schema": SCHEMAS[g]}}
        )
        params = SamplingParams(max_tokens=r["max_tokens"], temperature=r["temperature"], seed=r["seed"])
        made.append(Request([{"role": "user", "content": "Answer."}], params, response_format=fmt))
    for r, out in zip(requests, executor.run(made)):
        assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), out.error
        if out.finish_reason is FinishReason.STOP:
            g = r["grammar"]
            if isinstance(g, str):
                assert re.fullmatch(REGEXES[int(g[2:])], out.text), out.text
            else:
                jsonschema.validate(json.loads(out.text), SCHEMAS[g])
            assert out.guided_valid is True, out.guided_error
        else:
            assert out.guided_valid is not None  # checked, and said so, even when cut short
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.block_tables

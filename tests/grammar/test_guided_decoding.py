"""Guided decoding inside the speculative loop, on a tiny float64 model with the SmolLM2 tokenizer."""

from __future__ import annotations

import dataclasses
import json
import math

import jsonschema
import pytest
import torch
from factories import assert_all_pages_free, schema_format
from guided_runs import PERSON, SPECS, VOCAB, guided_executor, person_requests
from specexec import FinishReason, Request, SamplingParams
from specexec.drafters import Drafter, DraftProposal

#: drafters checked for identity only (the validity tests above cover the verification they share)
IDENTITY_ONLY = {
    "lookahead-tree": {"decoding_type": "Lookahead", "max_draft_len": 3, "draft_tree": True},
    "layer-skip": {"decoding_type": "LayerSkip", "max_draft_len": 3, "skip_layers": [2]},
}


class RandomDrafter(Drafter):
    """Proposes random ids: most are grammar-invalid, so the cut and the masks must catch them."""

    def __init__(self, max_draft_len: int = 3) -> None:
        super().__init__(max_draft_len)
        self.gen = torch.Generator().manual_seed(0)

    def propose(self, request, num_slots, resources):
        return DraftProposal(torch.randint(0, VOCAB, (num_slots,), generator=self.gen).tolist())


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_finished_guided_output_validates(spec_name, temperature):
    executor = guided_executor(SPECS[spec_name])
    outputs = executor.run(person_requests(4, temperature, max_tokens=80))
    finished = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    assert finished, "no guided request finished: the test would check nothing"
    for out in finished:
        jsonschema.validate(json.loads(out.text), PERSON)
    assert_all_pages_free(executor)


@pytest.mark.parametrize(
    "spec_name",
    [
        "ngram",
        "ngram-tree",
        "suffix",
        "rest",
        "self-int8",
        "eagle3",
        "lookahead-tree",
        "layer-skip",
        "medusa",
        "random",
    ],
)
def test_greedy_guided_speculation_is_token_identical(spec_name):
    baseline = [o.token_ids for o in guided_executor().run(person_requests(4))]
    drafter = RandomDrafter() if spec_name == "random" else None
    executor = guided_executor(None if drafter else {**SPECS, **IDENTITY_ONLY}[spec_name], drafter=drafter)
    outputs = executor.run(person_requests(4))
    assert [o.token_ids for o in outputs] == baseline
    assert sum(o.metrics.num_draft_tokens for o in outputs) > 0
    assert_all_pages_free(executor)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_tree_node_is_masked_after_its_own_path(temperature, monkeypatch):
    """An oracle hides each guided request's output (as decoded without drafts) in the second branch of
    its trees, under a garbage first branch: every row is masked by the grammar after its node's path,
    so the output is the same token for token (greedy, and seed for seed when sampled), valid, and the
    true branch is accepted off the first branch."""
    import specexec.executor.engine.engine_core as engine_core
    from oracle_tree_drafter import OracleTreeDrafter

    moves = []
    move = engine_core.move_accepted_kv
    monkeypatch.setattr(
        engine_core,
        "move_accepted_kv",
        lambda kv, t, root, path: moves.append(path) or move(kv, t, root, path),
    )
    requests = [
        dataclasses.replace(r, request_id=f"r{i}") for i, r in enumerate(person_requests(4, temperature))
    ]
    plain = guided_executor().run(requests)
    drafter = OracleTreeDrafter({o.request_id: o.token_ids for o in plain}, vocab=VOCAB)
    executor = guided_executor(
        {"decoding_type": "Oracle", "draft_tree": True, "draft_len_policy": "fixed"}, drafter=drafter
    )
    outputs = executor.run(requests)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    assert all(o.guided_valid for o in outputs if o.finish_reason is FinishReason.STOP)
    assert drafter.num_trees > 0 and moves, "no tree was verified off its first branch"
    assert sum(o.metrics.num_accepted_tokens for o in outputs) >= 2 * len(moves)
    assert_all_pages_free(executor)


#: penalties that favour tokens already seen (the prompt's, the output's), most of which the grammar
#: forbids at any given point: the masks must still win
FAVOURING_PENALTIES = {"repetition_penalty": 0.2, "frequency_penalty": -2.0, "presence_penalty": -2.0}


def with_penalties(requests: list[Request], **penalties) -> list[Request]:
    for r in requests:
        r.sampling_params = dataclasses.replace(r.sampling_params, logprobs=5, **penalties)
    return requests


@pytest.mark.parametrize("spec_name", ["ngram", "self-int8"])
def test_penalties_never_unmask_a_token(spec_name):
    """Penalties come before the grammar masks: penalized guided output still validates, its chosen
    tokens have finite log-probabilities, and drafts keep greedy output identical."""
    unpenalized = guided_executor().run(with_penalties(person_requests(4)))
    baseline = guided_executor().run(with_penalties(person_requests(4), **FAVOURING_PENALTIES))
    assert [o.token_ids for o in baseline] != [o.token_ids for o in unpenalized]
    executor = guided_executor(SPECS[spec_name])
    outputs = executor.run(with_penalties(person_requests(4), **FAVOURING_PENALTIES))
    assert [o.token_ids for o in outputs] == [o.token_ids for o in baseline]
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    finished = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    assert finished, "no guided request finished: the test would check nothing"
    for out in finished:
        jsonschema.validate(json.loads(out.text), PERSON)
    for out in outputs:
        assert all(math.isfinite(e.logprob) for e in out.logprobs)
    assert_all_pages_free(executor)


def test_random_drafts_are_cut_at_the_first_grammar_invalid_token():
    executor = guided_executor(drafter=RandomDrafter())
    outputs = executor.run(person_requests(2))
    assert sum(o.metrics.num_grammar_rejected_drafts for o in outputs) > 0


def test_forced_tokens_become_drafts():
    """`{"name": "` is forced at the start of the object: it arrives as drafts and is accepted."""
    executor = guided_executor()
    out = executor.run(person_requests(1))[0]
    assert out.metrics.num_forced_tokens > 0
    assert out.metrics.num_accepted_tokens > 0


def test_only_tokens_the_grammar_forces_count_as_forced():
    """A request without a grammar has nothing forced, however much its drafter drafts."""
    executor = guided_executor(drafter=RandomDrafter())
    out = executor.run([Request("Count to ten.", SamplingParams(max_tokens=20))])[0]
    assert out.metrics.num_draft_tokens > 0 and out.metrics.num_forced_tokens == 0


def test_bad_schema_errors_alone_and_others_finish():
    executor = guided_executor(SPECS["ngram"])
    bad = Request(
        "hi", SamplingParams(max_tokens=8), response_format=schema_format({"type": "nonsense"}, "t")
    )
    bad_shape = Request("hi", SamplingParams(max_tokens=8), response_format={"type": "json_schema"})
    good = person_requests(1)[0]
    plain = Request("hello", SamplingParams(max_tokens=8))
    out_bad, out_shape, out_good, out_plain = executor.run([bad, bad_shape, good, plain])
    assert out_bad.finish_reason is FinishReason.ERROR and "schema" in out_bad.error
    assert out_shape.finish_reason is FinishReason.ERROR
    assert out_good.finish_reason is not FinishReason.ERROR
    assert out_plain.finish_reason is FinishReason.LENGTH
    assert_all_pages_free(executor)


def test_regex_and_ebnf_formats_constrain_the_output():
    executor = guided_executor()
    regex = Request(
        "x", SamplingParams(max_tokens=20), response_format={"type": "regex", "regex": "(yes|no)!"}
    )
    ebnf = Request(
        "x",
        SamplingParams(max_tokens=20),
        response_format={"type": "grammar", "grammar": 'root ::= "a" [0-9] [0-9]'},
    )
    out_regex, out_ebnf = executor.run([regex, ebnf])
    assert out_regex.text in ("yes!", "no!")
    assert len(out_ebnf.text) == 3 and out_ebnf.text[0] == "a" and out_ebnf.text[1:].isdigit()


def test_masks_are_built_while_the_forward_runs():
    executor = guided_executor(SPECS["ngram"])
    executor.run(person_requests(2))
    stats = executor.guided.stats
    assert stats.num_steps > 0
    assert stats.mask_build_ms > 0


def test_preempted_guided_request_replays_its_grammar():
    executor = guided_executor(num_kv_blocks=24, max_batch_size=4)
    outputs = executor.run(person_requests(4, max_tokens=40))
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    reference = guided_executor().run(person_requests(4, max_tokens=40))
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    assert_all_pages_free(executor)


@pytest.mark.parametrize("spec_name", list(SPECS))
def test_guided_steps_through_the_captured_forwards_are_identical_and_valid(spec_name):
    """The grammar masks on replayed steps (target, draft model, EAGLE-3 head all through the captured
    path, forced runs of up to 16 tokens included): the same greedy tokens as the plain run without
    drafts, every finished output valid, and sampled requests valid too."""
    from capture_checks import graph_stats, replay_captured_forwards

    baseline = [o.token_ids for o in guided_executor().run(person_requests(4))]
    executor = guided_executor(SPECS[spec_name])  # drafting every step, so the captured forwards run
    replay_captured_forwards(executor)
    outputs = executor.run(person_requests(4) + person_requests(2, temperature=1.0))
    assert [o.token_ids for o in outputs[:4]] == baseline
    for out in outputs:
        assert out.error is None, out.error
        if out.finish_reason is FinishReason.STOP:
            jsonschema.validate(json.loads(out.text), PERSON)
            assert out.guided_valid is True
    assert any(o.finish_reason is FinishReason.STOP for o in outputs)
    assert all(s.num_replays > 0 for s in graph_stats(executor))
    assert executor.speculation.stats.num_drafter_errors == 0
    assert_all_pages_free(executor)

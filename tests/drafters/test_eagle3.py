"""EAGLE-3: a synthetic head in the published layout on a tiny float64 target.

- the head loads from config.json + model.safetensors, maps draft ids through d2t, and keeps greedy
  output token-identical (batch 1 and 8, chunked prefill, preemption), with every page freed;
- every proposal equals a from-scratch reference: the head run densely over transformers'
  ``output_hidden_states`` of the verified tokens, then chained on its own outputs (this checks the
  hidden-state capture, the token shift, positions, the paged cache, its rewinds and catch-up);
- the hidden states a request returns equal transformers' ``output_hidden_states``, with drafts
  rejected, prompts chunked and requests preempted;
- draft-side grammar masks through d2t forbid exactly the draft ids whose target token is forbidden.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from eagle3_heads import DRAFT_VOCAB, VOCAB, dense_causal_attention, eagle_spec, make_head_dir
from factories import drafting_config, greedy_requests
from specexec.drafters.eagle3.drafter import Eagle3Drafter
from specexec.drafters.eagle3.head import (
    ARCHITECTURE,
    Eagle3Head,
    default_aux_layers,
    load_head,
)
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.speculation.confidence_stop import ChainOdds, ConfidenceStop
from specexec.executor.engine.speculation.draft_length import ForwardCostModel
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from speculative_runs import BATCHES, MAX_TOKENS, num_accepted, num_drafted, run_speculative
from tiny_models import make_tiny_model

# ---- loading ---------------------------------------------------------------------------------------------


def test_published_layout_round_trips(tmp_path):
    make_head_dir(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {
        "fc.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.self_attn.q_proj.weight",
        "norm.weight",
    } <= keys
    assert {"lm_head.weight", "d2t", "t2d", "midlayer.mlp.gate_proj.weight"} <= keys
    assert not any(k.startswith("embed_tokens") for k in keys), "the target's embeddings are not the head's"
    embeddings = torch.nn.Embedding(VOCAB, 32)
    head = load_head(tmp_path, embeddings, torch.float64, "cpu")
    assert head.lm_head.weight.shape == (DRAFT_VOCAB, 32)
    assert head.midlayer.self_attn.q_proj.weight.shape == (32, 64)  # takes embedding ++ feature
    assert embeddings.weight.dtype == torch.float32, "loading must not cast the target's embeddings"
    assert "sliding_window" not in config and head.config.sliding_window is None


def test_a_heads_sliding_window_round_trips(tmp_path):
    make_head_dir(tmp_path, sliding_window=7)
    assert json.loads((tmp_path / "config.json").read_text())["sliding_window"] == 7
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float64, "cpu")
    assert head.config.sliding_window == 7


def test_d2t_maps_draft_ids_onto_their_target_tokens(tmp_path):
    make_head_dir(tmp_path)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float64, "cpu")
    target_ids = head.to_target_ids(torch.arange(DRAFT_VOCAB))
    assert torch.equal(target_ids, head.t2d.nonzero().squeeze(1)), "draft id i is the i-th draft-vocab token"
    assert len(set(target_ids.tolist())) == DRAFT_VOCAB


def test_head_with_its_own_embeddings_uses_them(tmp_path):
    make_head_dir(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["embed_tokens.weight"] = torch.randn(VOCAB, 32, dtype=torch.float64)
    save_file(state, str(tmp_path / "model.safetensors"))
    head = load_head(tmp_path, None, torch.float64, "cpu")
    assert torch.equal(head.embed(torch.tensor([5])), state["embed_tokens.weight"][5:6])


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "model.safetensors").unlink(), "expected model.safetensors"),
        (lambda d: _edit_config(d, architectures=["LlamaForCausalLM"]), "not an EAGLE-3 head"),
        (lambda d: _edit_config(d, sliding_window=0), "sliding_window must be a positive integer"),
        (lambda d: _edit_config(d, sliding_window="512"), "sliding_window must be a positive integer"),
        (lambda d: _edit_config(d, draft_vocab_size=DRAFT_VOCAB + 1), "d2t has shape"),
        (lambda d: _edit_state(d, d2t=torch.full((DRAFT_VOCAB,), 10_000)), "outside the vocabulary"),
        (
            lambda d: _edit_state(
                d, d2t=torch.zeros(DRAFT_VOCAB, dtype=torch.long) - torch.arange(DRAFT_VOCAB)
            ),
            "onto one target token",
        ),
    ],
)
def test_broken_heads_are_refused_with_a_clear_error(tmp_path, breakage, message):
    make_head_dir(tmp_path)
    breakage(tmp_path)
    with pytest.raises((ValueError, RuntimeError), match=message):
        load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float64, "cpu")


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _edit_state(path, **changes):
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    state.update(changes)
    save_file(state, str(path / "model.safetensors"))


def test_eagle_without_a_head_for_a_custom_model_fails_before_drafting(tmp_path):
    _, model = make_tiny_model("llama")
    config = drafting_config(speculative_config={"decoding_type": "Eagle3", "max_draft_len": 3})
    config.model = str(tmp_path)  # not the embedded model: the shipped head does not fit
    with pytest.raises(ValueError, match="speculative_model"):
        Executor(model, config)


def test_head_for_another_target_width_is_refused(tmp_path):
    make_head_dir(tmp_path)
    _edit_config(tmp_path, target_hidden_size=48)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["fc.weight"] = torch.zeros(32, 3 * 48, dtype=torch.float64)
    save_file(state, str(tmp_path / "model.safetensors"))
    _, model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="hidden size is 32"):
        Executor(model, drafting_config(speculative_config=eagle_spec(tmp_path)))


def test_default_aux_layers_are_low_middle_high():
    assert default_aux_layers(30) == (2, 15, 27)
    assert default_aux_layers(32) == (2, 16, 29)


# ---- greedy identity and the reference drafter ---------------------------------------------------------


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_eagle_keeps_greedy_output_identical(tmp_path, arch, batch):
    make_head_dir(tmp_path)
    _, outputs = run_speculative(arch, BATCHES[batch], speculative_config=eagle_spec(tmp_path))
    assert num_drafted(outputs) > 0


def eagle_reference_drafts(head: Eagle3Head, target, layers, tokens: list[int], k: int) -> list[int]:
    return reference_chain(head, target, layers, tokens, k)[0]


def reference_chain(head: Eagle3Head, target, layers, tokens: list[int], k: int, text=(), below: float = 0.0):
    """EAGLE-3 drafting from scratch: transformers' hidden states of the verified tokens (all but the
    last), the head run densely over pairs (h_t, x_{t+1}), then chained on its own outputs; the drafts
    and the head's confidence in each (its largest probability); every position computed, a head's
    ``sliding_window`` applied by the mask alone. With a ``text`` continuation (prompt lookup) its
    token is the draft wherever the head's confidence is below ``below``, until the chain leaves it."""
    attend = partial(dense_causal_attention, window=head.config.sliding_window)
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        hidden = head.fuse(torch.cat([hs[i][0] for i in layers], -1))  # [N-1, hidden]
        ids = torch.tensor(tokens[1:])
        drafts, confidences = [], []
        for _ in range(k):
            out = head.step(ids, hidden, torch.arange(len(ids)), attend)
            logits = head.logits(out[-1])
            draft = int(head.to_target_ids(logits.argmax()))
            confidence = float(logits.softmax(-1).max())
            if len(text) > len(drafts) and confidence < below:
                draft = text[len(drafts)]
            elif len(text) > len(drafts) and draft != text[len(drafts)]:
                text = ()
            drafts.append(draft)
            confidences.append(confidence)
            hidden = torch.cat([hidden, out[-1:]])
            ids = torch.cat([ids, torch.tensor([draft])])
    return drafts, confidences


def record_proposals(drafter: Eagle3Drafter) -> list[tuple[list[int], list[int]]]:
    seen: list[tuple[list[int], list[int]]] = []
    prepare = drafter.prepare_draft_tokens

    def recording(scheduled, resources):
        snapshot = {s.request.request_id: list(s.request.token_ids) for s in scheduled}
        proposals = prepare(scheduled, resources)
        seen.extend((snapshot[rid], p.token_ids) for rid, p in proposals.items())
        return proposals

    drafter.prepare_draft_tokens = recording
    return seen


@pytest.mark.parametrize(
    "setting",
    [
        "plain",
        "chunked-catch-up",
        "chunked-prefill",
        "preemption",
        "windowed",
        "windowed-chunked-catch-up",
        "windowed-preemption",
    ],
)
def test_every_proposal_equals_the_from_scratch_reference(tmp_path, setting):
    """Windowed: a head with a sliding window of 5 positions skips computing the older slots of each
    catch-up; its drafts still equal a reference that computes every position and masks."""
    windowed = setting.startswith("windowed")
    setting = setting.removeprefix("windowed-") if setting != "windowed" else "plain"
    make_head_dir(tmp_path, sliding_window=5 if windowed else None)
    _, target = make_tiny_model("llama")
    head = load_head(tmp_path, target.get_input_embeddings(), torch.float64, "cpu")
    catch_up_tokens = 8 if setting != "plain" else 128
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4, max_num_tokens=catch_up_tokens)
    proposals = record_proposals(drafter)
    overrides = {"chunked-prefill": {"max_num_tokens": 16}, "preemption": {"num_kv_blocks": 40}}.get(
        setting, {}
    )
    _, outputs = run_speculative("llama", BATCHES["batch8"], drafter=drafter, **overrides)
    if setting == "preemption":
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
    _, fresh_target = make_tiny_model("llama")  # the executor's copy now runs paged attention only
    assert len(proposals) > 20
    for tokens, drafted in proposals:
        assert drafted, "every scheduled decode gets drafts"
        assert drafted == eagle_reference_drafts(head, fresh_target, (1, 2, 3), tokens, len(drafted)), tokens


# ---- prompt lookup: the request's own text where the head is unsure -------------------------------------


def text_reference(tokens: list[int], min_match: int, longest: int = 3, k: int = 3) -> list[int]:
    """What followed the first earlier occurrence of the longest suffix (``longest`` tokens at most)
    that occurred before, when that suffix has at least ``min_match`` tokens; else []."""
    for n in range(min(longest, len(tokens) - 1), 0, -1):
        starts = [c for c in range(n, len(tokens)) if tokens[c - n : c] == tokens[-n:]]
        if starts:
            return tokens[starts[0] : starts[0] + k] if n >= min_match else []
    return []


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
def test_prompt_lookup_drafts_the_text_where_the_head_is_unsure(tmp_path, batch):
    """Every proposal equals the from-scratch reference chain with the text's tokens taken where the
    head's confidence is below the bar; greedy output stays identical and every page comes back. The
    repetitive prompts give some steps a text to follow, so both sources draft."""
    make_head_dir(tmp_path)
    _, target = make_tiny_model("llama")
    head = load_head(tmp_path, target.get_input_embeddings(), torch.float64, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4, prompt_lookup=True)
    proposals = record_proposals(drafter)
    _, outputs = run_speculative("llama", BATCHES[batch], drafter=drafter)
    _, fresh_target = make_tiny_model("llama")
    from_text = from_head = 0
    for tokens, drafted in proposals:
        text = text_reference(tokens, drafter.lookup_min_match)
        want, sure = reference_chain(
            head, fresh_target, (1, 2, 3), tokens, len(drafted), text, drafter.lookup_below_confidence
        )
        assert drafted == want, tokens
        unsure = [i < len(text) and c < drafter.lookup_below_confidence for i, c in enumerate(sure)]
        from_text += sum(unsure)
        from_head += len(unsure) - sum(unsure)
    assert from_text == drafter.num_drafts_from_text
    assert from_text > 0 and from_head > 0, (from_text, from_head)
    assert num_accepted(outputs) > 0


def test_a_text_token_the_grammar_forbids_is_not_drafted(tmp_path):
    make_head_dir(tmp_path)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float32, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4, prompt_lookup=True)
    drafter.lookup_below_confidence = 1.1  # the text always wins where the grammar allows it
    request = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), generator=None)
    target_of = head.to_target_ids(torch.arange(DRAFT_VOCAB)).tolist()
    allowed = set(target_of[::2])
    forbidden = next(t for t in range(VOCAB) if t not in allowed)
    logits = torch.randn(2, DRAFT_VOCAB, generator=torch.Generator().manual_seed(4))
    head_best = target_of[max(range(0, DRAFT_VOCAB, 2), key=lambda i: logits[1, i])]  # its allowed argmax
    text = next(t for t in sorted(allowed) if t != head_best)
    picks = drafter._pick_rows(
        logits, [request] * 2, [FixedMaskMatcher(allowed), FixedMaskMatcher(allowed)], [forbidden, text]
    )
    assert picks[0][0] in allowed and picks[0][0] != forbidden, "the head's allowed token instead"
    assert picks[1][0] == text, "an allowed text token is the draft where the head is unsure"


# ---- draft length by the head's confidence ----------------------------------------------------------------


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
def test_confidence_policy_keeps_greedy_output_identical(tmp_path, batch):
    make_head_dir(tmp_path / "head")
    spec = {**eagle_spec(tmp_path / "head"), "draft_len_policy": "confidence"}
    executor, _ = run_speculative("llama", BATCHES[batch], speculative_config=spec, cache_dir=str(tmp_path))
    assert isinstance(executor.speculation.drafter.confidence_stop, ConfidenceStop)
    assert executor.speculation.policy is None, "the head ends its chains itself"


#: the random head's confidences lie around 0.02-0.04: on this curve a first draft pays above 0.03, so
#: some chains get one and some none (a second never pays: it would need a confidence near 0.9)
SOME_PAY = ForwardCostModel([1, 2], [1.0, 1.03])


@pytest.mark.parametrize(
    "curve, batch, lengths",
    [
        pytest.param(ForwardCostModel([1, 64], [1.0, 1.0]), "batch8", {3}, id="free-drafts-full-chains"),
        pytest.param(ForwardCostModel([1, 2], [1.0, 2.0]), "batch8", set(), id="costly-drafts-none"),
        # (alone: in a batch of 8 its share of the forward is small, and a first draft needs 0.2)
        pytest.param(SOME_PAY, "batch1", {0, 1}, id="each-chain-where-it-stops-paying"),
    ],
)
def test_each_chain_ends_at_the_first_draft_that_does_not_pay(tmp_path, curve, batch, lengths):
    make_head_dir(tmp_path)
    _, target = make_tiny_model("llama")
    head = load_head(tmp_path, target.get_input_embeddings(), torch.float64, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4)
    rule = ConfidenceStop(curve)
    rule.time_draft_step = lambda seconds: None  # no wall-clock times: the decisions are reproducible
    seen = []
    prepare = drafter.prepare_draft_tokens

    def recording(scheduled, resources):
        snapshot = {s.request.request_id: (list(s.request.token_ids), s.num_draft_slots) for s in scheduled}
        proposals = prepare(scheduled, resources)
        seen.extend((*snapshot[rid], len(scheduled), p.token_ids) for rid, p in proposals.items())
        return proposals

    drafter.prepare_draft_tokens = recording

    def use_rule(executor):
        drafter = executor.speculation.drafter
        drafter.bind_target(dataclasses.replace(drafter.binding, confidence_stop=rule))

    _, outputs = run_speculative("llama", BATCHES[batch], drafter=drafter, before_run=use_rule)
    _, fresh_target = make_tiny_model("llama")
    assert len(seen) >= 8
    for tokens, num_slots, batch_size, drafted in seen:
        drafts, confidences = reference_chain(head, fresh_target, (1, 2, 3), tokens, num_slots)
        chain = ChainOdds()
        for c in confidences:
            if not rule.keeps(chain, c, batch_size):
                break
            chain.keep(c)
        assert drafted == drafts[: chain.num_drafts], tokens
    full = [d for _, num_slots, _, d in seen if num_slots == 3]  # (not the last tokens' shorter room)
    assert {len(d) for d in full} == lengths or not lengths and num_drafted(outputs) == 0


@pytest.mark.parametrize("text_odds, kept", [(1.0, True), (0.0, False)], ids=["text-pays", "text-does-not"])
def test_under_the_confidence_policy_a_text_draft_is_judged_by_its_own_odds(tmp_path, text_odds, kept):
    """The random head is unsure everywhere (confidence about 0.03), so wherever the request's text
    continues, the text drafts. Under the confidence rule a text draft is kept or not by what
    `TextOdds` estimates for it, not by the head's confidence; the output stays the same, the pages
    come back, and the target's verdicts on text drafts reach the estimate."""
    make_head_dir(tmp_path)
    _, target = make_tiny_model("llama")
    head = load_head(tmp_path, target.get_input_embeddings(), torch.float64, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4, prompt_lookup=True)
    rule = ConfidenceStop(SOME_PAY)
    rule.time_draft_step = lambda seconds: None
    drafter.text_odds.estimate = lambda request_id: text_odds
    proposals = record_proposals(drafter)

    def use_rule(executor):
        drafter = executor.speculation.drafter
        drafter.bind_target(dataclasses.replace(drafter.binding, confidence_stop=rule))

    run_speculative("llama", BATCHES["batch8"], drafter=drafter, before_run=use_rule)
    with_text = [(t, d) for t, d in proposals if text_reference(t, drafter.lookup_min_match)]
    assert len(with_text) >= 3
    for tokens, drafted in with_text:
        text = text_reference(tokens, drafter.lookup_min_match)
        if kept:
            assert drafted and drafted[0] == text[0], tokens
        else:
            assert drafted == [], tokens
    if kept:
        assert drafter.text_odds._all.judged > 0


@pytest.mark.parametrize("window", [1, 5, 19, 40])
def test_a_windowed_catch_up_computes_only_its_window_and_equals_every_position_computed(tmp_path, window):
    """A 20-token prompt's catch-up: the head computes only the last ``window`` of its 19 positions, and
    its output at the last one equals the head run densely over all 19, masked to the window."""
    make_head_dir(tmp_path, sliding_window=window)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32).double(), torch.float64, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4)
    tokens = list(range(20, 40))
    features = torch.randn(19, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    request = SimpleNamespace(request_id="r", token_ids=tokens, num_tokens=20, target_hidden=[(0, features)])
    computed = []
    forward = drafter._forward
    drafter._forward = lambda seqs, hidden: computed.append(len(hidden)) or forward(seqs, hidden)
    assert drafter._take_features(request)
    out, logits, _ = drafter._catch_up([request])
    assert sum(computed) == min(window, 19)
    with torch.no_grad():
        attend = partial(dense_causal_attention, window=window)
        dense = head.step(torch.tensor(tokens[1:]), head.fuse(features), torch.arange(19), attend)
        torch.testing.assert_close(out[0], dense[-1], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(logits[0], head.logits(dense[-1]), rtol=1e-9, atol=1e-9)
    assert drafter.block_manager.num_slots["r"] == 19, "the skipped positions' slots are held"
    drafter.release(request)
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks


def test_full_head_pool_ends_drafting_without_leaks(tmp_path):
    make_head_dir(tmp_path)
    _, target = make_tiny_model("llama")
    head = load_head(tmp_path, target.get_input_embeddings(), torch.float64, "cpu")
    drafter = Eagle3Drafter(
        head, 3, VOCAB, 4, block_size=4, kv_cache_memory_gb=12 * 4 * 2 * 2 * 8 * 8 / 2**30
    )
    assert drafter.block_manager.num_blocks == 12
    _, outputs = run_speculative("llama", BATCHES["batch8"], drafter=drafter)
    assert sum(1 for o in outputs if o.metrics.num_draft_tokens) < len(outputs), "the pool was big enough"


# ---- captured hidden states ------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["plain", "ngram-drafts-and-preemption", "chunked-prefill"])
def test_returned_hidden_states_equal_transformers(setting):
    _, model = make_tiny_model("llama")
    _, reference_model = make_tiny_model("llama")
    overrides = {"capture_hidden_layers": [0, 2, 4]}
    if setting != "plain":
        overrides.update(num_kv_blocks=40, speculative_config={"decoding_type": "NGram", "max_draft_len": 4})
    if setting == "chunked-prefill":
        overrides = {"capture_hidden_layers": [0, 2, 4], "max_num_tokens": 16}
    executor = Executor(model, drafting_config(**overrides))
    outputs = executor.run(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
    if setting == "ngram-drafts-and-preemption":
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
        assert sum(o.metrics.num_draft_tokens - o.metrics.num_accepted_tokens for o in outputs) > 0
    for out in outputs:
        fed = out.prompt_token_ids + out.token_ids[:-1]
        with torch.no_grad():
            hs = reference_model(input_ids=torch.tensor([fed]), output_hidden_states=True).hidden_states
        want = torch.cat([hs[0][0], hs[2][0], hs[4][0]], -1)
        assert out.hidden_states.shape == want.shape
        torch.testing.assert_close(out.hidden_states, want, rtol=1e-9, atol=1e-9)


def test_no_hidden_states_unless_asked():
    _, model = make_tiny_model("llama")
    outputs = Executor(model, drafting_config()).run(greedy_requests(BATCHES["batch1"], MAX_TOKENS))
    assert outputs[0].hidden_states is None


# ---- grammar masks through d2t ---------------------------------------------------------------------------


class FixedMaskMatcher:
    """A grammar matcher stand-in that allows a fixed set of target tokens."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.accepted: list[int] = []

    def is_terminated(self) -> bool:
        return False

    def fill_next_token_bitmask(self, bitmask, row: int) -> None:
        words = torch.zeros(bitmask.shape[1], dtype=torch.int64)
        for t in self.allowed:
            words[t // 32] |= 1 << (t % 32)
        bitmask[row] = words.to(torch.int32)  # (bit 31 wraps to the sign bit, as xgrammar's does)

    def accept_token(self, token: int) -> bool:
        self.accepted.append(token)
        return token in self.allowed


@pytest.mark.parametrize("seed", range(5))
def test_draft_side_mask_forbids_exactly_what_the_target_mask_forbids(tmp_path, seed):
    make_head_dir(tmp_path, seed=seed)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float32, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4)
    allowed = set(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:40].tolist())
    logits = torch.randn(DRAFT_VOCAB)
    request = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), generator=None)
    matcher = FixedMaskMatcher(allowed)
    ((token, _, _, _),) = drafter._pick_rows(logits[None], [request], [matcher])
    target_of = head.to_target_ids(torch.arange(DRAFT_VOCAB)).tolist()
    for draft_id, target_id in enumerate(target_of):
        assert torch.isfinite(logits[draft_id]) == (target_id in allowed), (draft_id, target_id)
    best = max((i for i, t in enumerate(target_of) if t in allowed), key=lambda i: logits[i])
    assert token == target_of[best]
    assert matcher.accepted == [token]


def test_rows_of_one_drafting_step_are_picked_each_by_its_own_grammar(tmp_path):
    """One step's rows together (one read back for all): a guided row masked through d2t, an unguided
    row, a row whose grammar is complete, each picked as if alone."""
    make_head_dir(tmp_path)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float32, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4)
    request = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), generator=None)
    logits = torch.randn(3, DRAFT_VOCAB, generator=torch.Generator().manual_seed(3))
    target_of = head.to_target_ids(torch.arange(DRAFT_VOCAB)).tolist()
    allowed = set(target_of[::5])
    done = FixedMaskMatcher(set(range(VOCAB)))
    done.is_terminated = lambda: True
    alone = [
        drafter._pick_rows(logits[i : i + 1].clone(), [request], [m])[0]
        for i, m in enumerate([FixedMaskMatcher(allowed), None, done])
    ]
    together = drafter._pick_rows(logits, [request] * 3, [FixedMaskMatcher(allowed), None, done])
    assert together == alone
    assert together[0][0] in allowed and together[1][0] == target_of[int(logits[1].argmax())]
    assert together[2] == (None, None, 0.0, False)


def test_grammar_with_no_draft_vocab_token_allowed_stops_drafting(tmp_path):
    make_head_dir(tmp_path)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float32, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4)
    outside = set(range(VOCAB)) - set(head.to_target_ids(torch.arange(DRAFT_VOCAB)).tolist())
    request = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), generator=None)
    matcher = FixedMaskMatcher({min(outside)})
    ((token, q, _, _),) = drafter._pick_rows(torch.randn(1, DRAFT_VOCAB), [request], [matcher])
    assert token is None and q is None


def test_sampled_drafts_carry_q_over_the_target_vocabulary(tmp_path):
    make_head_dir(tmp_path)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32), torch.float64, "cpu")
    drafter = Eagle3Drafter(head, 3, VOCAB, 4, block_size=4, sample_drafts=True)
    request = SimpleNamespace(
        sampling_params=SamplingParams(temperature=0.7), generator=torch.Generator().manual_seed(0)
    )
    ((token, q, _, _),) = drafter._pick_rows(
        torch.randn(1, DRAFT_VOCAB, dtype=torch.float64), [request], [None]
    )
    assert q.shape == (VOCAB,)
    assert torch.isclose(q.sum(), torch.tensor(1.0, dtype=q.dtype))
    assert q[token] > 0
    assert not q[~head.t2d].any(), "q is zero outside the draft vocabulary"


def test_executor_config_accepts_eagle_aliases(tmp_path):
    make_head_dir(tmp_path)
    for name in ("Eagle", "Eagle3", "eagle3"):
        spec = {**eagle_spec(tmp_path), "decoding_type": name}
        config = ExecutorConfig(speculative_config=spec, dtype="float64", device="cpu", num_kv_blocks=64)
        _, model = make_tiny_model("llama")
        executor = Executor(model, config)
        assert isinstance(executor.speculation.drafter, Eagle3Drafter)
        assert executor.speculation.drafter.hidden_state_layers == (1, 2, 3)

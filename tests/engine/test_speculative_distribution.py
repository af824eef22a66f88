"""Sampling with speculation is lossless: at temperature 1 the generated sequences are distributed
exactly as the target model's own samples, whatever the drafter.

The target is a tiny float64 llama with an 8-token vocabulary. The exact distribution of its first
``MAX_TOKENS`` generated tokens after a fixed prompt is the product of its conditionals, computed from
one Hugging Face forward over every prefix. One executor run samples ``NUM_SAMPLES`` requests (one seed
each) with a drafter, and a chi-square test compares the counts of whole generated sequences with the
exact probabilities (cells with a small expected count are merged).

With ``MAX_TOKENS = 4`` the first token comes from the prefill, the second step carries two drafts
(verified with or without q), and a rejected step is followed by a one-draft step: acceptance, the
recovered token and the bonus token all shape the sampled sequences.
"""

from __future__ import annotations

import functools
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from eagle3_heads import make_head_dir
from medusa_heads import make_medusa_dir
from rest_stores import token_datastore_file
from sampled_distribution import (
    INIT_RANGE,
    MAX_TOKENS,
    P_VALUE_THRESHOLD,
    PROMPT,
    VOCAB,
    chi_square_p_value,
    exact_distribution,
    make_target,
    plain_samples,
    sample_sequences,
)
from specexec.drafters.base import Drafter, DraftProposal
from specexec.drafters.draft_target import DraftTargetDrafter
from specexec.drafters.eagle3.drafter import Eagle3Drafter
from specexec.drafters.eagle3.head import load_head
from specexec.drafters.lookahead.drafter import LookaheadDrafter
from specexec.drafters.ngram import NGramDrafter
from specexec.drafters.retrieval.rest import RestDrafter, RestOptions
from specexec.drafters.retrieval.suffix import SuffixDrafter
from tiny_models import make_tiny_model

MAX_DRAFT_LEN = 2


# ---- drafters --------------------------------------------------------------------------------------------


class FixedTokenDrafter(Drafter):
    """Always proposes the same token (a deterministic drafter: verified by sampling p)."""

    def __init__(self, max_draft_len: int, token: int) -> None:
        super().__init__(max_draft_len)
        self.token = token

    def propose(self, request, num_slots, resources) -> DraftProposal:
        return DraftProposal([self.token] * num_slots)


class MislabelledQDrafter(FixedTokenDrafter):
    """Always proposes the same token but claims it drew it from the uniform distribution: its q is
    not the distribution of its drafts, so min(1, p/q) verification is biased (used to show the test
    has the power to see a broken q path)."""

    is_deterministic = False
    returns_draft_probs = True

    def propose(self, request, num_slots, resources) -> DraftProposal:
        return DraftProposal([self.token] * num_slots, torch.full((num_slots, VOCAB), 1 / VOCAB))


def likeliest_second_token() -> int:
    """The token most often generated second: the fixed drafter is accepted about half the time."""
    marginal = Counter()
    for seq, p in exact_distribution().items():
        marginal[seq[1]] += p
    return marginal.most_common(1)[0][0]


def drafter_for_kind(kind: str) -> tuple[Drafter | None, dict | None]:
    """(drafter instance, speculative_config) for one of DRAFTERS."""
    if kind == "fixed-token":
        return FixedTokenDrafter(MAX_DRAFT_LEN, likeliest_second_token()), None
    if kind == "ngram":
        return NGramDrafter(max_draft_len=MAX_DRAFT_LEN), None
    if kind == "suffix":  # one-token matches draft too, so that short samples see drafts
        return SuffixDrafter(max_draft_len=MAX_DRAFT_LEN, max_spec_offset=2.0), None
    if kind == "rest":  # a datastore of the prompt and some of the likeliest sequences after it
        likeliest = sorted(exact_distribution().items(), key=lambda item: -item[1])[:20]
        store = token_datastore_file([PROMPT] + [PROMPT + list(seq) for seq, _ in likeliest])
        return RestDrafter(MAX_DRAFT_LEN, RestOptions(datastore=store, max_spec_offset=2.0)), None
    if kind == "lookahead":
        return LookaheadDrafter(max_draft_len=MAX_DRAFT_LEN), None
    if kind in ("medusa", "medusa-tree"):  # heads near the LM head: drafts often, accepted now and then
        heads = make_medusa_dir(
            Path(tempfile.mkdtemp()),
            num_heads=MAX_DRAFT_LEN,
            noise=0.3,
            vocab_size=VOCAB,
            initializer_range=INIT_RANGE,
        )
        spec = {"decoding_type": "Medusa", "max_draft_len": MAX_DRAFT_LEN, "speculative_model": str(heads)}
        return None, {
            **spec,
            "draft_tree": {"max_nodes": 4, "branching": 2},
        } if kind == "medusa-tree" else spec
    if kind == "layer-skip":
        return None, {"decoding_type": "LayerSkip", "max_draft_len": MAX_DRAFT_LEN, "skip_layers": [1]}
    if kind == "int8-self-draft-q":
        spec = {"decoding_type": "DraftTarget", "max_draft_len": MAX_DRAFT_LEN, "sample_drafts": True}
        return None, spec
    if kind == "eagle3-reduced-vocab-q":  # q is zero on the 2 tokens outside the draft vocabulary
        head_dir = make_head_dir(Path(tempfile.mkdtemp()), vocab=VOCAB, draft_vocab=VOCAB - 2)
        spec = {"decoding_type": "Eagle", "max_draft_len": MAX_DRAFT_LEN, "sample_drafts": True}
        return None, {**spec, "speculative_model": str(head_dir), "prompt_lookup": False}
    if kind == "eagle3-lookup-q":  # drafts from the text (one-hot q) where it matches, else the head's
        head_dir = make_head_dir(Path(tempfile.mkdtemp()), vocab=VOCAB, draft_vocab=VOCAB - 2)
        _, target = make_target()
        head = load_head(head_dir, target.get_input_embeddings(), torch.float64, "cpu")
        layers = target.config.num_hidden_layers
        drafter = Eagle3Drafter(head, MAX_DRAFT_LEN, VOCAB, layers, sample_drafts=True, prompt_lookup=True)
        # the text drafts wherever its last token occurred before (about 3 drafts in 10 here)
        drafter.lookup_min_match, drafter.lookup_below_confidence = 1, 1.1
        return drafter, None
    # an independent draft model: same vocabulary, other weights, one layer; q differs from p
    _, draft = make_tiny_model(
        "llama", vocab_size=VOCAB, initializer_range=INIT_RANGE, seed=5, num_hidden_layers=1
    )
    drafter = DraftTargetDrafter(
        draft, MAX_DRAFT_LEN, VOCAB, sample_drafts=True, num_kv_blocks=4096, block_size=4, max_num_tokens=4096
    )
    return drafter, None


DRAFTERS = [
    "fixed-token",
    "ngram",
    "suffix",
    "rest",
    "lookahead",
    "layer-skip",
    "medusa",
    "medusa-tree",
    "int8-self-draft-q",
    "independent-draft-q",
    "eagle3-reduced-vocab-q",
    "eagle3-lookup-q",
]


# ---- the reference and the test's power ------------------------------------------------------------------


def test_exact_distribution_is_a_distribution_with_mass_on_few_sequences():
    dist = exact_distribution()
    assert len(dist) == VOCAB**MAX_TOKENS
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-9)
    top = sorted(dist.values(), reverse=True)
    assert sum(top[:200]) > 0.8, "too flat: the chi-square test would have little power"
    assert top[0] < 0.5, "too peaked: drafts would nearly always be accepted"


def test_sampling_without_speculation_matches_the_exact_distribution():
    counts = Counter(map(tuple, plain_samples()))
    p_value, cells = chi_square_p_value(counts, exact_distribution())
    assert cells > 30
    assert p_value > P_VALUE_THRESHOLD, p_value


def test_chi_square_test_detects_a_slightly_different_temperature():
    """Power check: samples at temperature 0.85 must fail the test against temperature 1."""
    _, _, counts = sample_sequences(temperature=0.85)
    p_value, _ = chi_square_p_value(counts, exact_distribution())
    assert p_value < P_VALUE_THRESHOLD, p_value


def test_chi_square_test_detects_drafts_verified_against_a_wrong_q():
    """Power check: a drafter whose q is not what its drafts are drawn from biases the output."""
    drafter = MislabelledQDrafter(MAX_DRAFT_LEN, likeliest_second_token())
    _, _, counts = sample_sequences(drafter)
    p_value, _ = chi_square_p_value(counts, exact_distribution())
    assert p_value < P_VALUE_THRESHOLD, p_value


# ---- with speculation -------------------------------------------------------------------------------------


@functools.cache
def speculative_samples(kind: str):
    """(executor, outputs, counts) of one run with the drafter ``kind`` (each run done once)."""
    drafter, spec = drafter_for_kind(kind)
    return sample_sequences(drafter, speculative_config=spec)


@pytest.mark.parametrize("kind", DRAFTERS)
def test_speculative_sampling_matches_the_target_distribution(kind):
    executor, outputs, counts = speculative_samples(kind)
    drafter = executor.speculation.drafter
    if kind.endswith("-q"):
        assert drafter.returns_draft_probs and not drafter.is_deterministic
    proposed = sum(o.metrics.num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    at_second_position = sum(sum(o.metrics.proposed_per_position[1:]) for o in outputs)
    assert accepted > 0, "no draft accepted: acceptance and the bonus token were not exercised"
    assert proposed - accepted >= 20, "too few rejections: the recovered token was barely exercised"
    assert at_second_position > 0, "no two-draft step"
    if kind == "eagle3-lookup-q":
        assert proposed / 5 < drafter.num_drafts_from_text < proposed, "many from the text, some not"
    p_value, cells = chi_square_p_value(counts, exact_distribution())
    assert p_value > P_VALUE_THRESHOLD, (
        f"{kind}: sequences not distributed as the target's (p = {p_value:.2e} over {cells} cells; "
        f"{accepted}/{proposed} drafts accepted)"
    )


@pytest.mark.parametrize(
    "kind", ["fixed-token", "ngram", "suffix", "rest", "lookahead", "layer-skip", "medusa"]
)
def test_deterministic_drafts_reproduce_the_plain_samples_seed_for_seed(kind):
    """Deterministic drafts are verified by drawing x_i ~ p_i with the request's generator, one draw
    per emitted token as plain sampling does; so a seeded request gets the very same tokens with or
    without such a drafter."""
    _, outputs, _ = speculative_samples(kind)
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    mismatches = [i for i, (o, want) in enumerate(zip(outputs, plain_samples())) if o.token_ids != want]
    assert not mismatches, f"{len(mismatches)} seeded requests changed, e.g. request {mismatches[0]}"


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_speculative_sampling_on_a_quantized_target_matches_its_distribution(quantization):
    """Lossless relative to the quantized target: an int4 self-draft samples drafts (q) for it."""
    spec = {
        "decoding_type": "DraftTarget",
        "max_draft_len": MAX_DRAFT_LEN,
        "sample_drafts": True,
        "quantization": "int4" if quantization == "int8" else "int8",
    }
    executor, outputs, counts = sample_sequences(speculative_config=spec, quantization=quantization)
    assert executor.setup.quantization.scheme == quantization
    proposed = sum(o.metrics.num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert accepted > 0 and proposed - accepted >= 20
    p_value, cells = chi_square_p_value(counts, exact_distribution(quantization=quantization))
    assert p_value > P_VALUE_THRESHOLD, f"p = {p_value:.2e} over {cells} cells"
    assert chi_square_p_value(counts, exact_distribution())[0] < P_VALUE_THRESHOLD, (
        "the dense model's distribution fits too: the test could not tell the quantized target apart"
    )

"""RequestGrammar: mask rows for a draft, rollback after verification, termination."""

from __future__ import annotations

import random

import pytest
import torch
import xgrammar as xgr
from grammar_support import (
    EOS,
    VALID_JSON,
    allowed,
    allowed_ids,
    encode,
    new_bitmask,
    reference_mask,
    schema_grammar,
)
from specexec.grammar import GrammarError, RequestGrammar, RowFill


def assert_rows_match(bm, row0, fill, prefix, drafts):
    """Row r of the fill equals a fresh matcher fed prefix + drafts[:r]."""
    for r in range(fill.num_rows_filled):
        ref, terminated = reference_mask(schema_grammar(), prefix + list(drafts[:r]))
        assert not terminated and torch.equal(bm[row0 + r], ref), f"row {r}"


def test_fill_rows_all_drafts_valid():
    ids = encode(VALID_JSON)
    rg = RequestGrammar(schema_grammar())
    bm = new_bitmask(8)
    fill = rg.fill_rows(bm, 1, ids[:5])
    assert fill == RowFill(6, 5, None, False)
    assert_rows_match(bm, 1, fill, [], ids[:5])
    assert all(allowed(bm[1 + i], t) for i, t in enumerate(ids[:5]))
    assert (bm[0] == 0x5A5A5A5A).all() and (bm[7] == 0x5A5A5A5A).all()  # other rows untouched


def test_fill_rows_stops_at_first_invalid_draft():
    ids = encode(VALID_JSON)  # '{"', 'a', '":', ' ', '1', ...
    bad = encode("hello")[0]  # letters cannot start the integer value
    drafts = ids[:3] + [bad] + ids[4:6]
    rg = RequestGrammar(schema_grammar())
    bm = new_bitmask(len(drafts) + 1)
    fill = rg.fill_rows(bm, 0, drafts)
    assert fill == RowFill(4, 3, 3, False)
    assert not allowed(bm[3], bad)  # the row of the rejected draft forbids it
    assert (bm[4:] == 0x5A5A5A5A).all()
    assert_rows_match(bm, 0, fill, [], drafts)
    rg.after_verification(3, ids[3])  # the target rejected `bad` and emitted the right token
    ref, _ = reference_mask(schema_grammar(), ids[:4])
    fill = rg.fill_rows(bm, 0, [])
    assert fill == RowFill(1, 0, None, False) and torch.equal(bm[0], ref)


def _pick(rng: random.Random, row: torch.Tensor) -> int:
    """A random allowed token, mostly from a pool of JSON-ish tokens so the walk can terminate."""
    ids = allowed_ids(row).tolist()
    pool = set(encode('{"a": -305, "b": "hi \\"x\\""}') + encode('{"a":7,"b":""}') + [EOS])
    preferred = [t for t in ids if t in pool]
    return rng.choice(preferred if preferred and rng.random() < 0.8 else ids)


@pytest.mark.parametrize("seed", range(8))
def test_rollback_invariant_random_steps(seed):
    rng = random.Random(seed)
    compiled = schema_grammar()
    rg = RequestGrammar(compiled)
    truth: list[int] = []  # verified tokens (the last may still be rg.pending_token)
    bm, scratch = new_bitmask(8), new_bitmask(1)
    for _step in range(60):
        # 30%: draft from rg's own fork (that path flushes the pending token early)
        drafter = rg.fork_for_drafting() if rng.random() < 0.3 else reference_matcher(compiled, truth)
        drafts = []
        for _ in range(rng.randint(0, 5)):
            if drafter.is_terminated():
                break
            drafter.fill_next_token_bitmask(scratch)
            tok = rng.randrange(49152) if rng.random() < 0.15 else _pick(rng, scratch[0])
            drafts.append(tok)
            if not drafter.accept_token(tok):
                drafts += [rng.randrange(49152) for _ in range(rng.randint(0, 2))]
                break
        row0 = rng.randint(0, 7 - len(drafts))
        fill = rg.fill_rows(bm, row0, drafts)
        assert_rows_match(bm, row0, fill, truth, drafts)
        n_acc = rng.randint(0, fill.num_drafts_accepted_by_grammar)
        truth += drafts[:n_acc]
        if fill.terminated and n_acc == fill.num_drafts_accepted_by_grammar:
            rg.after_verification(n_acc, None)  # the stop token was verified: the request ends
            assert rg.is_terminated() and reference_mask(compiled, truth)[1]
            return
        emitted = _pick(rng, bm[row0 + n_acc])
        truth.append(emitted)
        rg.after_verification(n_acc, emitted)
        assert rg.pending_token == emitted
        ref, ref_terminated = reference_mask(compiled, truth)
        if ref_terminated:
            assert rg.is_terminated()
            return
    ref, _ = reference_mask(compiled, truth)
    rg.fork_for_drafting().fill_next_token_bitmask(scratch)
    assert torch.equal(scratch[0], ref)


def reference_matcher(compiled, tokens):
    m = xgr.GrammarMatcher(compiled)
    assert all(m.accept_token(t) for t in tokens)
    return m


def test_terminated_matcher_is_never_filled():
    ids = encode(VALID_JSON)
    rg = RequestGrammar(schema_grammar())
    rg.accept_now(ids)
    bm = new_bitmask(4)
    fill = rg.fill_rows(bm, 0, [EOS, 5])  # EOS accepted as a draft: nothing after it is filled
    assert fill == RowFill(1, 1, None, True)
    assert allowed_ids(bm[0]).tolist() == [EOS] and (bm[1:] == 0x5A5A5A5A).all()
    rg.after_verification(0, EOS)  # rollback of the draft EOS, then the verified EOS is pending
    bm = new_bitmask(4)
    assert rg.fill_rows(bm, 0, [7, 8]) == RowFill(0, 0, None, True)
    assert (bm == 0x5A5A5A5A).all()
    rg.after_verification(0, None)
    assert rg.is_terminated() and rg.forced_tokens(8) == []


def test_protocol_errors():
    ids = encode(VALID_JSON)
    rg = RequestGrammar(schema_grammar())
    with pytest.raises(GrammarError, match="position 1"):
        rg.accept_now([ids[0], encode("hello")[0]])
    rg = RequestGrammar(schema_grammar())
    bm = new_bitmask(4)
    with pytest.raises(ValueError, match="do not fit"):
        rg.fill_rows(bm, 1, ids[:3])
    rg.fill_rows(bm, 0, ids[:2])
    with pytest.raises(RuntimeError, match="after_verification"):
        rg.fill_rows(bm, 0, [])
    with pytest.raises(GrammarError, match="accepted only 2"):
        rg.after_verification(3, ids[3])
    rg.after_verification(2, encode("hello")[0])  # an emitted token the grammar forbids
    with pytest.raises(GrammarError, match="rejected the emitted token"):
        rg.fill_rows(bm, 0, [])


def test_fork_and_forced_tokens_use_the_pending_token():
    ids = encode(VALID_JSON)
    rg = RequestGrammar(schema_grammar())
    rg.after_verification(0, ids[0])  # '{"' pending
    forced = rg.forced_tokens(8)
    reference = reference_matcher(schema_grammar(), ids[:1])
    assert forced, "after '{\"' the schema forces the key 'a'"
    for token in forced:  # each forced token was the only one the grammar allowed
        row = new_bitmask(1)
        reference.fill_next_token_bitmask(row)
        assert allowed_ids(row[0]).tolist() == [token]
        assert reference.accept_token(token)
    row = new_bitmask(1)
    reference.fill_next_token_bitmask(row)
    assert len(allowed_ids(row[0])) != 1  # the walk stopped where a choice begins
    fork = rg.fork_for_drafting()
    assert fork.accept_token(ids[1]) and fork.accept_token(ids[2])
    bm = new_bitmask(1)
    rg.fill_rows(bm, 0, [])  # the fork's tokens did not reach rg
    assert torch.equal(bm[0], reference_mask(schema_grammar(), ids[:1])[0])


def _row(allowed_ids: list[int], vocab: int = 64) -> torch.Tensor:
    row = torch.zeros(xgr.get_bitmask_shape(1, vocab)[1], dtype=torch.int32)
    for i in allowed_ids:
        row[i // 32] |= torch.tensor(1 << (i % 32)).to(torch.int32)
    return row


def test_forced_token_is_the_only_one_or_the_longest_whose_prefixes_are_all_the_others():
    from specexec.grammar.request_grammar import forced_token

    vocab = [b"<eos>", b"n", b"na", b"nam", b"name", b"x", b"a"] + [b"t%d" % i for i in range(57)]
    assert forced_token(_row([5]), None) == 5  # the only allowed token, no vocabulary needed
    assert forced_token(_row([1, 2, 4]), vocab) == 4  # "n", "na", "name": the text "name" is forced
    assert forced_token(_row([1, 2, 4]), None) is None
    assert forced_token(_row([1, 4, 5]), vocab) is None  # "x" is another way on
    assert forced_token(_row([0, 1]), vocab, stop_token_ids={0}) is None  # a stop token is a choice
    assert forced_token(_row([0]), vocab, stop_token_ids={0}) == 0  # ... unless it is the only one
    runs = [b"a" * k for k in range(1, 101)]  # each one a prefix of the next
    assert forced_token(_row(list(range(10)), 128), runs) == 9
    assert forced_token(_row(list(range(100)), 128), runs) is None  # more than 64 allowed: a choice
    assert forced_token(_row([]), vocab) is None


def test_a_trees_rows_are_each_nodes_mask_after_its_path():
    """Node i's row is what a fresh matcher fed the node's path allows; a node the grammar refuses gets
    no row, nor does its child; the matcher stays at the root until the walk's branch is accepted."""
    ids = encode(VALID_JSON)
    bad = encode("hello")[0]
    # 0: ids[0]; 1: ids[1] under 0; 2: bad under 0 (refused); 3: ids[1] under 2 (under a refused node);
    # 4: ids[2] under 1
    tokens, parents = [ids[0], ids[1], bad, ids[1], ids[2]], [-1, 0, 0, 2, 1]
    rg = RequestGrammar(schema_grammar())
    bm = new_bitmask(len(tokens) + 2)
    fill = rg.fill_tree_rows(bm, 1, tokens, parents)
    assert fill.tree_rows == (0, 1, 2, 5) and fill.num_invalid_nodes == 2
    for row, path in ((0, []), (1, ids[:1]), (2, ids[:2]), (5, ids[:3])):
        ref, _ = reference_mask(schema_grammar(), path)
        assert torch.equal(bm[1 + row], ref), f"row {row}"
    assert (bm[1 + 3] == 0x5A5A5A5A).all() and (bm[1 + 4] == 0x5A5A5A5A).all()  # rows of refused nodes
    assert rg.after_tree_verification(ids[:2], ids[2]) is None  # the walk took nodes 0 and 1
    ref, _ = reference_mask(schema_grammar(), ids[:3])
    assert rg.fill_rows(bm, 0, []) == RowFill(1, 0, None, False) and torch.equal(bm[0], ref)


def test_a_tree_node_that_ends_the_output_gets_no_row_and_the_walk_through_it_ends_the_grammar():
    ids = encode(VALID_JSON) + [EOS]
    rg = RequestGrammar(schema_grammar(), override_stop_tokens=[EOS])
    rg.accept_now(ids[:-2])
    tokens, parents = [ids[-2], EOS, ids[0]], [-1, 0, 1]  # the last token, EOS, then anything
    bm = new_bitmask(4)
    fill = rg.fill_tree_rows(bm, 0, tokens, parents)
    assert fill.tree_rows == (0, 1) and fill.num_invalid_nodes == 1  # EOS's row and its child: none
    assert rg.after_tree_verification(tokens, 7) == 2  # the output ends with EOS, nothing after it
    assert rg.is_terminated()

"""REST (`drafters/retrieval/rest.py`, `datastore.py`, ``specexec build-datastore``): the datastore file
round trip and what it refuses, drafting from it, and greedy identity on the tiny float64 models."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_requests import FakeRequest
from grammar_support import smollm2_tokenizer
from rest_stores import token_store
from specexec.cli import main
from specexec.drafters.retrieval.datastore import (
    DatastoreError,
    build_datastore,
    load_datastore,
    save_datastore,
    tokenizer_fingerprint,
)
from specexec.drafters.retrieval.rest import RestDrafter, RestOptions
from speculative_runs import BATCHES, num_accepted, reference, run_speculative

DOCUMENTS = [
    "def add(a, b):\n    return a + b\n",
    "Once upon a time. The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


def test_datastore_round_trip_and_its_counts(tokenizer, tmp_path):
    store = build_datastore([DOCUMENTS[0], "", DOCUMENTS[1]], tokenizer, ["a.txt"])
    path = save_datastore(store, tmp_path / "store")
    assert path.name == "store.npz" and not list(tmp_path.glob("*.partial"))
    loaded = load_datastore(path, tokenizer, len(tokenizer))
    assert loaded.num_documents == 2, "the empty text is skipped"
    assert list(loaded.documents()) == [tokenizer.encode(d, add_special_tokens=False) for d in DOCUMENTS]
    assert loaded.meta["num_tokens"] == len(loaded.tokens) and loaded.meta["sources"] == ["a.txt"]


class OtherTokenizer:
    def get_vocab(self):
        return {"a": 0, "b": 1}


def test_a_datastore_of_another_tokenizer_or_a_damaged_file_is_refused(tokenizer, tmp_path):
    path = save_datastore(build_datastore(DOCUMENTS, tokenizer, ["a.txt"]), tmp_path / "store.npz")
    with pytest.raises(DatastoreError, match="another tokenizer"):
        load_datastore(path, OtherTokenizer())
    with pytest.raises(DatastoreError, match="outside the target's vocabulary"):
        load_datastore(path, None, vocab_size=10)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(DatastoreError, match="cannot read datastore"):
        load_datastore(tmp_path / "junk.npz")
    np.savez(
        tmp_path / "other.npz", tokens=np.zeros(3, np.int32), offsets=np.array([0, 3]), meta=np.array("{}")
    )
    with pytest.raises(DatastoreError, match="not a specexec datastore"):
        load_datastore(tmp_path / "other.npz")
    damaged = token_store([[1, 2, 3]])
    damaged.offsets = np.array([0, 5])
    save_datastore(damaged, tmp_path / "damaged.npz")
    with pytest.raises(DatastoreError, match="damaged"):
        load_datastore(tmp_path / "damaged.npz")


def test_rest_drafts_what_followed_the_match_in_the_corpus(tokenizer, tmp_path):
    path = save_datastore(build_datastore(DOCUMENTS, tokenizer, ["a.txt"]), tmp_path / "store.npz")
    drafter = RestDrafter(8, RestOptions(datastore=str(path)), tokenizer, len(tokenizer))
    context = tokenizer.encode("Say it. The quick brown fox", add_special_tokens=False)
    request = FakeRequest("r0", context, len(context))
    slots = drafter.num_draft_slots(request)
    drafts = drafter.propose(request, slots).token_ids
    assert len(drafts) == slots > 0
    whole = tokenizer.encode(DOCUMENTS[1], add_special_tokens=False)
    start = whole.index(context[-1]) + 1  # after "fox"
    assert drafts == whole[start : start + len(drafts)]
    assert tokenizer.decode(drafts).startswith(" jumps over")


@pytest.mark.parametrize("batch", BATCHES)
def test_rest_drafts_keep_greedy_output_identical(batch, tmp_path):
    prompts = BATCHES[batch]
    # text like the model's own: the first halves of its greedy answers, and some that are not
    answers = reference("llama", prompts)
    corpus = [a[: len(a) // 2] for a in answers] + [list(range(40, 80)), [3, 1, 4, 1, 5, 9, 2, 6]]
    path = save_datastore(token_store(corpus), tmp_path / "store.npz")
    spec = {"decoding_type": "REST", "max_draft_len": 5, "datastore": str(path)}
    executor, outputs = run_speculative("llama", prompts, speculative_config=spec)
    assert num_accepted(outputs) > 0, "no REST draft was accepted: the test no longer exercises acceptance"


def test_rest_options_are_refused_with_the_option_named(tmp_path):
    from specexec.executor.config import ExecutorConfig
    from specexec.executor.executor import Executor
    from tiny_models import make_tiny_model

    _, model = make_tiny_model("llama")
    for options, message in [
        ({}, "REST needs option datastore"),
        ({"datastore": str(tmp_path)}, "is not a file"),
        ({"datastore": str(tmp_path), "min_token_prob": 2}, "min_token_prob"),
        ({"datastore": str(tmp_path), "max_cached_requests": 2}, "unknown REST option"),
    ]:
        with pytest.raises(ValueError, match=message):
            Executor(model, ExecutorConfig(speculative_config={"decoding_type": "REST", **options}))


def test_build_datastore_command_reads_text_and_jsonl_files(tokenizer, tmp_path, capsys):
    model = tmp_path / "model"
    tokenizer.save_pretrained(model)  # a directory with the tokenizer alone: loads fast
    (tmp_path / "a.txt").write_text(DOCUMENTS[0])
    records = [{"text": DOCUMENTS[1]}, {"text": [{"role": "user", "content": "hi"}, "there"]}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    out = tmp_path / "store.npz"
    args = ["build-datastore", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"), "--output", str(out)]
    assert main([*args, "--model", str(model)]) == 0
    store = load_datastore(out, tokenizer)
    assert store.num_documents == 4 and "4 documents" in capsys.readouterr().err
    assert store.meta["tokenizer_fingerprint"] == tokenizer_fingerprint(tokenizer)
    assert main([*args, "--model", str(model), "--field", "body"]) == 2
    assert "no field 'body'" in capsys.readouterr().err
    (tmp_path / "c.bin").write_bytes(b"\xff\xfe binary")
    assert (
        main(["build-datastore", str(tmp_path / "c.bin"), "--output", str(out), "--model", str(model)]) == 2
    )
    assert "c.bin is not UTF-8 text" in capsys.readouterr().err
    assert main(["build-datastore", str(tmp_path), "--output", str(out)]) == 2
    assert "is not a file" in capsys.readouterr().err


@pytest.mark.slow
def test_build_datastore_reads_the_gguf_tokenizer_the_executor_loads(tokenizer):
    """``build-datastore`` reads the GGUF's tokenizer without its weights; the executor's comes from the
    converted copy. A datastore from one must be accepted by the other."""
    from specexec.drafters.retrieval.datastore_command import load_tokenizer

    assert tokenizer_fingerprint(load_tokenizer(None)) == tokenizer_fingerprint(tokenizer)

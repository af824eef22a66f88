"""Guided decoding on a tiny random model with the SmolLM2 tokenizer (its 49,152-token vocabulary).

- `guided_executor`: the tiny llama (float defaults, 256 pages of 8), compact JSON, drafting with a
  spec of `SPECS` (or a drafter) every step;
- `person_requests`: chat requests for a `PERSON` as JSON;
- `SPECS`: a drafter of each kind over that vocabulary (EAGLE-3 and Medusa heads over a reduced one).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from eagle3_heads import make_head_dir
from factories import drafting_every_step, schema_format
from grammar_support import VOCAB, smollm2_tokenizer
from medusa_heads import make_medusa_dir
from rest_stores import text_datastore_file
from specexec import Executor, ExecutorConfig, Request, SamplingParams
from tiny_models import make_tiny_model

__all__ = ["EAGLE3_HEAD", "MEDUSA_HEADS", "PERSON", "SPECS", "VOCAB", "guided_executor", "person_requests"]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}

#: an EAGLE-3 head over a reduced vocabulary: the 1024 lowest ids (punctuation, digits, short words)
#: and 1024 others, so d2t is not the identity and many grammar-allowed tokens lie outside it
EAGLE3_HEAD = make_head_dir(
    tempfile.mkdtemp(),
    vocab=VOCAB,
    draft_vocab=2048,
    draft_ids=torch.cat(
        [
            torch.arange(1024),
            torch.randperm(VOCAB - 1024, generator=torch.Generator().manual_seed(0))[:1024] + 1024,
        ]
    ),
)
MEDUSA_HEADS = str(
    make_medusa_dir(
        Path(tempfile.mkdtemp()),
        draft_ids=torch.cat([torch.arange(1024), torch.arange(2048, 3072)]),
        vocab_size=VOCAB,
    )
)
SPECS = {
    "none": None,
    "ngram": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2},
    "suffix": {"decoding_type": "Suffix", "max_draft_len": 6},
    # token trees: a guided request verifies its tree's first branch (its rows are masked as a chain)
    "ngram-tree": {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 2,
        "draft_tree": True,
    },
    # REST over compact JSON like the schema's, and text that is not (its drafts are cut by the grammar)
    "rest": {
        "decoding_type": "REST",
        "max_draft_len": 6,
        "datastore": text_datastore_file(
            ['{"name":"Rex","age":3,"kind":"dog"}', '{"name":"Tom","age":12,"kind":"cat"}', "Describe pets."],
            smollm2_tokenizer(),
        ),
    },
    "self-int8": {"decoding_type": "DraftTarget", "max_draft_len": 3},
    "eagle3": {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": EAGLE3_HEAD},
    # Medusa heads over the same reduced vocabulary: each head's row masked after the drafts before it
    "medusa": {"decoding_type": "Medusa", "max_draft_len": 3, "speculative_model": MEDUSA_HEADS},
}


def guided_executor(spec=None, drafter=None, seed=0, model_overrides=None, **config):
    _, model = make_tiny_model("llama", seed=seed, vocab_size=VOCAB, **(model_overrides or {}))
    settings = {"num_kv_blocks": 256, "block_size": 8, "guided_json_max_whitespace": 0, **config}
    # (compact JSON: a random model would otherwise pad its output with whitespace)
    cfg = ExecutorConfig(speculative_config=drafting_every_step(spec), **settings)
    return Executor(model, cfg, tokenizer=smollm2_tokenizer(), drafter=drafter)


def person_requests(n: int, temperature: float = 0.0, max_tokens: int = 60) -> list[Request]:
    """``n`` chat requests for a PERSON as JSON, seeded 0, 1, ..."""
    prompts = [[{"role": "user", "content": f"Describe pet number {i} as JSON."}] for i in range(n)]
    return [
        Request(
            p,
            SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=i),
            response_format=schema_format(PERSON, "t"),
        )
        for i, p in enumerate(prompts)
    ]

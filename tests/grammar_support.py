"""Shared helpers for the grammar tests: the SmolLM2 tokenizer (`smollm2_tokenizer`), a small schema
compiled by xgrammar (`schema_grammar`), xgrammar's own mask for a prefix (`reference_mask`) and the
bitmask's conventions (`new_bitmask`, `allowed`, `allowed_ids`); a schema's grammar without a tokenizer
(`make_grammar`) and whether it, or jsonschema, accepts an instance (`grammar_accepts`,
`jsonschema_accepts`); `tag_grammar` marks one request's
grammar in an executor, so that a patched RequestGrammar method misbehaves for that request alone."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import jsonschema
import torch
import xgrammar as xgr
from referencing import Registry
from xgrammar.testing import _is_grammar_accept_string

VOCAB = 49152
EOS = 2  # <|im_end|>
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["a", "b"],
}
VALID_JSON = '{"a": 12, "b": "hi there"}'


def _cache_root() -> Path:
    env = os.environ.get("SPECEXEC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specexec"


@functools.cache
def smollm2_tokenizer():
    """The SmolLM2 tokenizer from the converted-model cache (converting the GGUF once if missing)."""
    from transformers import AutoTokenizer

    dirs = sorted(_cache_root().glob("SmolLM2-135M-Instruct.Q4_1-*"))
    dirs = [d for d in dirs if (d / "tokenizer.json").is_file()]
    if dirs:
        return AutoTokenizer.from_pretrained(dirs[0])
    from specexec.executor.model.model_loader import load_model

    return load_model(None, progress=False).tokenizer


@functools.cache
def tokenizer_info() -> xgr.TokenizerInfo:
    return xgr.TokenizerInfo.from_huggingface(smollm2_tokenizer(), vocab_size=VOCAB, stop_token_ids=[EOS])


@functools.cache
def schema_grammar() -> xgr.CompiledGrammar:
    return xgr.GrammarCompiler(tokenizer_info(), max_threads=1).compile_json_schema(json.dumps(SCHEMA))


def encode(text: str) -> list[int]:
    return smollm2_tokenizer().encode(text, add_special_tokens=False)


def new_bitmask(rows: int, fill: int = 0x5A5A5A5A) -> torch.Tensor:
    """int32 [rows, words] filled with a sentinel so untouched rows are detectable."""
    return torch.full(xgr.get_bitmask_shape(rows, VOCAB), fill, dtype=torch.int32)


def reference_mask(compiled: xgr.CompiledGrammar, tokens: list[int]) -> tuple[torch.Tensor | None, bool]:
    """Mask row [words] of a fresh matcher fed `tokens` (None if terminated), and is_terminated."""
    m = xgr.GrammarMatcher(compiled)
    for i, t in enumerate(tokens):
        assert m.accept_token(t), f"reference matcher rejected token {t} at {i}"
    if m.is_terminated():
        return None, True
    bm = new_bitmask(1)
    m.fill_next_token_bitmask(bm)
    return bm[0], False


def allowed(row: torch.Tensor, token: int) -> bool:
    """xgrammar convention: bit token%32 of int32 word token//32 set = allowed."""
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def allowed_ids(row: torch.Tensor) -> torch.Tensor:
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [words, 32]
    return bits.flatten()[:VOCAB].nonzero().flatten()


def make_grammar(schema, any_order: bool = False) -> xgr.Grammar:
    """xgrammar's grammar for a schema: strict mode, any whitespace, properties in declared order unless
    any_order (xgrammar logs its warnings to stderr)."""
    text = json.dumps(schema)
    return xgr.Grammar.from_json_schema(text, any_whitespace=True, strict_mode=True, any_order=any_order)


def grammar_accepts(schema, instance) -> bool:
    return _is_grammar_accept_string(make_grammar(schema), json.dumps(instance))


def jsonschema_accepts(schema, instance) -> bool:
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return validator_class(schema, registry=Registry()).is_valid(instance)


def tag_grammar(executor, request_id: str, flag: str) -> None:
    """Set ``flag`` on the grammar of request ``request_id`` once it is compiled (so a patched
    RequestGrammar method can misbehave for that request alone)."""
    resolve = executor.guided.resolve

    def tagging_resolve(waiting):
        failed = resolve(waiting)
        for r in waiting:
            if r.request_id == request_id and r.grammar is not None:
                setattr(r.grammar, flag, True)
        return failed

    executor.guided.resolve = tagging_resolve

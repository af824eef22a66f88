"""Holds no tests: keeps `from test_grammar_support import smollm2_tokenizer` working in
tests/drafters/test_layer_skip.py and test_rest_drafter.py until they import it from tests/grammar_support.py
(the drafter rewrite owns those files); then this file goes."""

from grammar_support import smollm2_tokenizer

__all__ = ["smollm2_tokenizer"]

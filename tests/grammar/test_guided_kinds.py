"""Guided decoding by regex, by EBNF / GBNF grammar and by a list of choices (the kinds vLLM's
``structured_outputs``, SGLang's ``regex`` / ``ebnf`` and llama.cpp's ``grammar`` ask for), inside the
speculative loop: every finished output matches what was asked for, whatever the drafter and the
temperature."""

from __future__ import annotations

import pytest
from factories import assert_all_pages_free
from guided_runs import SPECS, guided_executor
from specexec import FinishReason, Request, SamplingParams
from specexec.grammar import GrammarError, GrammarSpec
from specexec.grammar.output_check import check_guided_output
from xgrammar.testing import _is_grammar_accept_string as grammar_accepts

EMAIL = r"[a-z]{1,6}@[a-z]{2,5}\.(com|org)"
#: llama.cpp's GBNF: several rules, character classes, an optional item
GREETING = """root ::= greeting " " name "!"
greeting ::= "hello" | "hi"
name ::= [A-Z] [a-z] [a-z]? [a-z]?
"""
#: strings with what an alternation must escape: quotes, backslashes, a newline, regex metacharacters
CHOICES = ["yes", "no", 'say "maybe"', "a\\b", "two\nlines", "(x|y)*", "ünï ✓"]
FORMATS = {
    "regex": {"type": "regex", "regex": EMAIL},
    "gbnf": {"type": "grammar", "grammar": GREETING},
    "choice": {"type": "choice", "choice": CHOICES},
}


def matches(kind: str, output: str) -> bool:
    """Whether ``output`` is a sentence of the format: Python's regex, xgrammar's own reading of the
    grammar, membership of the list."""
    if kind == "gbnf":
        return grammar_accepts(GREETING, output)
    spec = GrammarSpec.from_response_format(FORMATS[kind])
    return check_guided_output(spec.kind, spec.text, output).valid is True


def kind_requests(kind: str, n: int, temperature: float) -> list[Request]:
    return [
        Request(
            [{"role": "user", "content": f"Answer number {i}."}],
            SamplingParams(max_tokens=40, temperature=temperature, seed=i),
            response_format=FORMATS[kind],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("spec_name", ["none", "ngram", "suffix"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", list(FORMATS))
def test_every_finished_output_matches_its_regex_grammar_or_choices(kind, temperature, spec_name):
    executor = guided_executor(SPECS[spec_name])
    outputs = executor.run(kind_requests(kind, 4, temperature))
    finished = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    assert finished, "no guided request finished: the test would check nothing"
    for out in finished:
        assert matches(kind, out.text), out.text
        assert out.guided_valid is not False
    assert_all_pages_free(executor)


def test_a_choice_is_checked_by_membership():
    spec = GrammarSpec.from_response_format(FORMATS["choice"])
    assert check_guided_output(spec.kind, spec.text, "two\nlines").valid is True
    assert check_guided_output(spec.kind, spec.text, "two lines").valid is False


@pytest.mark.parametrize("choice", [[], "yes", ["yes", 1], None])
def test_a_choice_that_is_not_a_list_of_strings_is_refused(choice):
    with pytest.raises(GrammarError, match="choice"):
        GrammarSpec.from_response_format({"type": "choice", "choice": choice})

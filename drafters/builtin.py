"""The built-in drafters, registered with the plugin manager like any third-party plugin. Each drafter's
folder owns its options (`options.py`, parsed once before any model loads) and its factory
(`factory.py`: ``make(options, context)``); this module only names them."""

from __future__ import annotations

from ..plugins import hookimpl
from .draft_target import factory as draft_target
from .eagle3 import factory as eagle3
from .layer_skip import factory as layer_skip
from .lookahead import factory as lookahead
from .medusa import factory as medusa
from .ngram import factory as ngram
from .retrieval.rest import factory as rest
from .retrieval.suffix import factory as suffix
from .user_provided import factory as user_provided


@hookimpl
def specexec_drafter_factories() -> dict:
    return {
        "NGram": ngram.make,
        "Suffix": suffix.make,
        "REST": rest.make,
        "DraftTarget": draft_target.make,
        "Eagle": eagle3.make,
        "Eagle3": eagle3.make,
        "LayerSkip": layer_skip.make,
        "Lookahead": lookahead.make,
        "Medusa": medusa.make,
        "UserProvided": user_provided.make,
    }

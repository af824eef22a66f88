"""Minimal stand-ins for a request, with the fields a drafter reads (`request_id`, `token_ids`,
`num_prompt_tokens`, `finish_reason`); tests append tokens to them as the executor would."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

_ids = itertools.count()


@dataclass(eq=False)
class FakeRequest:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    finish_reason: str | None = None


def fake_request(token_ids, request_id: str | None = None) -> FakeRequest:
    """A FakeRequest whose prompt is ``token_ids`` (ids ``r0``, ``r1``, ... unless named)."""
    return FakeRequest(request_id or f"r{next(_ids)}", list(token_ids), len(token_ids))

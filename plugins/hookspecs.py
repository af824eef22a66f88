"""The hooks the executor loop calls. Drafters implement them (with ``specexec.hookimpl``).

Each hook is called with keyword arguments. With no drafter registered, the draft stages do nothing
and every request decodes one token per step. Every call goes through the executor's `DrafterGuard`:
a hook that raises, answers garbage or misses its deadline costs its requests their drafts for that
step, never their output.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("specexec")


@hookspec
def specexec_prepare_draft_requests(requests: list) -> dict:
    """Before scheduling: how many draft slots each decoding request needs, ``{request_id: int >= 0}``
    (a missing request gets none), so the scheduler's token budget and the KV cache count the draft
    tokens. A hook answers; it does not change the requests it is given."""


@hookspec
def specexec_prepare_draft_tokens(scheduled_requests: list, resources: object) -> dict:
    """After scheduling: propose drafts for the scheduled decoding requests (``.request``, with
    ``.num_draft_slots`` reserved). Returns ``{request_id: DraftProposal}``; the executor cuts
    proposals to the reserved slots and drops token ids outside the vocabulary."""


@hookspec
def specexec_on_verified(request: object, num_accepted: int) -> None:
    """After verification: how many of the request's draft tokens the target accepted."""


@hookspec
def specexec_release_request(request: object) -> None:
    """The request finished (or was preempted): drop any state kept for it."""


@hookspec
def specexec_drafter_factories() -> dict:
    """Drafters this plugin provides: ``{decoding_type name: factory}``. A factory is called as
    ``factory(options, context)`` and returns a ``Drafter``: ``options`` is the dataclass the factory
    declares with ``declare_options`` (parsed once, before any model loads), else the config's options
    mapping; ``context`` is a ``DrafterContext`` (its ``max_draft_len`` is the config's)."""

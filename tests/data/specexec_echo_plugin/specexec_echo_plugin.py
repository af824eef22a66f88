"""A specexec plugin in its own distribution: the "Echo" drafter proposes the request's last token
``max_draft_len`` times (right whenever the target repeats itself)."""

from __future__ import annotations

import specexec
from specexec.drafters import Drafter, DraftProposal


class EchoDrafter(Drafter):
    def propose(self, request, num_slots, resources):
        return DraftProposal([request.token_ids[-1]] * num_slots)


def make_echo(options, context):
    if options:
        raise ValueError(f"Echo takes no options, got {sorted(options)}")
    return EchoDrafter(context.max_draft_len)


@specexec.hookimpl
def specexec_drafter_factories():
    return {"Echo": make_echo}

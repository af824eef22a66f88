"""The numbers a server runs under (``specexec serve``'s flags), one dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from ..responses_api import MAX_STORED_BYTES


@dataclass(slots=True)
class ServerLimits:
    #: waiting + running sequences (a request's prompts x n) beyond which new requests get 503
    max_queued_requests: int = 256
    request_timeout_s: float = 600.0  #: a request running longer is aborted (504)
    retry_after_s: int = 1  #: the Retry-After of a 503
    #: a larger request body is refused (413) unread; None: from the context (`default_max_body_bytes`)
    max_body_bytes: int | None = None
    #: the Responses store's budget (the JSON of its conversations and bodies); the oldest go first
    max_stored_response_bytes: int = MAX_STORED_BYTES

"""What every route reads: the running executor's async front, what is served and under which limits,
and the objects the routes share (metrics, admission, the Responses store). Made once per app."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ...executor.async_executor import AsyncExecutor
from ..bad_request import HTTPError
from ..limits.access import Access
from ..limits.admission import Admission
from ..limits.body import default_max_body_bytes, read_json_body
from ..limits.server_limits import ServerLimits
from ..limits.text_bounds import max_chars_per_token
from ..metrics import ServerMetrics
from ..protocol import template_reads_name
from ..responses_api import ResponseStore


@dataclass(slots=True)
class ServerState:
    engine: AsyncExecutor  #: the async front the requests run on
    model_name: str  #: the name the model is served under (a request naming another gets 404)
    limits: ServerLimits
    access: Access  #: the API keys and the admin endpoints' rule
    metrics: ServerMetrics  #: the /metrics registry; each finished request is recorded once
    admission: Admission  #: the queue limit, counted in sequences
    stored: ResponseStore  #: the Responses API's stored responses
    tokenizer: Any
    max_model_len: int  #: the context, in tokens
    reads_name: bool  #: the chat template renders a message's ``name``
    max_body_bytes: int  #: a larger body is refused (413)
    max_prompt_chars: int  #: a prompt with more characters is refused (400) before it is tokenized
    created: int  #: when the app was made (Unix seconds): the model card's ``created``

    @classmethod
    def create(
        cls, engine: AsyncExecutor, model_name: str, limits: ServerLimits, access: Access
    ) -> ServerState:
        executor = engine.executor
        max_model_len, tokenizer = executor.max_model_len, executor.tokenizer
        return cls(
            engine=engine,
            model_name=model_name,
            limits=limits,
            access=access,
            metrics=ServerMetrics(executor, model_name),
            admission=Admission(engine, limits.max_queued_requests, limits.retry_after_s),
            stored=ResponseStore(max_bytes=limits.max_stored_response_bytes),
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            reads_name=template_reads_name(tokenizer),
            max_body_bytes=limits.max_body_bytes or default_max_body_bytes(max_model_len),
            max_prompt_chars=max_model_len * max_chars_per_token(tokenizer),
            created=int(time.time()),
        )

    async def read_body(self, request: Request) -> dict:
        """The request's JSON object, within the body's bounds (`limits/body.py`)."""
        return await read_json_body(request, self.max_body_bytes)

    def check_model(self, body: dict) -> None:
        """A 404 when the body names a model other than the one served (none named: this one)."""
        if body.get("model") not in (None, self.model_name):
            raise HTTPError(
                404,
                f"model {body['model']!r} is not served here; this server serves {self.model_name!r}",
                "not_found_error",
                "model",
                code="model_not_found",
            )

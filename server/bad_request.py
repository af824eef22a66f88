"""The errors a request ends with: `BadRequest` (a body refused, 400, ``param`` naming the field) and
`HTTPError` (any status, with OpenAI's error type and code)."""

from __future__ import annotations


class BadRequest(ValueError):
    """A request body the server refuses (HTTP 400); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        headers=None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.param, self.headers, self.code = status, kind, param, headers, code

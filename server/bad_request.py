"""The one error a request body can raise: a 400 whose ``param`` names the field."""

from __future__ import annotations


class BadRequest(ValueError):
    """A request body the server refuses (HTTP 400); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

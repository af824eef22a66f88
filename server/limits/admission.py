"""The queue limit, counted in sequences: a request of p prompts with ``n`` samples each is p x n of
them, as the engine runs them (counting prompts let 64 prompts x ``n: 16`` put 1,024 sequences past a
limit of 100). A request admitted holds a `Reservation` per prompt until that prompt's samples are
queued in the engine, so requests admitted together, before any of them reaches the engine, are
counted too."""

from __future__ import annotations

from ...executor.async_executor import AsyncExecutor
from ...executor.engine.request import Request
from ..bad_request import HTTPError


class Reservation:
    """One prompt's samples, counted until they are queued in the engine (or refused)."""

    def __init__(self, admission: Admission, num_sequences: int) -> None:
        self._admission, self.num_sequences = admission, num_sequences

    def release(self) -> None:
        """Hand the count over to the engine's (idempotent: a second call does nothing)."""
        if self.num_sequences:
            self._admission.num_reserved -= self.num_sequences
            self.num_sequences = 0


class Admission:
    """Admits a request's sequences while the engine's unfinished ones and those reserved stay within
    ``max_sequences``; a 503 with Retry-After otherwise, or while the server drains. Used from the event
    loop only (no lock)."""

    def __init__(self, engine: AsyncExecutor, max_sequences: int, retry_after_s: int) -> None:
        self.engine, self.max_sequences, self.retry_after_s = engine, max_sequences, retry_after_s
        self.num_reserved = 0  #: sequences admitted that have not reached the engine yet

    def admit(self, requests: list[Request]) -> list[Reservation]:
        """One reservation per request (prompt), or an HTTPError 503."""
        retry = {"Retry-After": str(self.retry_after_s)}
        if self.engine.is_closing:
            raise HTTPError(
                503, "the server is shutting down: send the request to another replica", "server_error",
                headers=retry,
            )  # fmt: skip
        sizes = [max(1, getattr(r.sampling_params, "n", 1)) for r in requests]
        queued = self.engine.num_unfinished + self.num_reserved
        if queued + sum(sizes) > self.max_sequences:
            raise HTTPError(
                503,
                f"{queued} sequences queued, {sum(sizes)} asked, at most {self.max_sequences}: "
                "try again later",
                "server_error",
                headers=retry,
            )
        self.num_reserved += sum(sizes)
        return [Reservation(self, size) for size in sizes]

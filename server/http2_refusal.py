"""specexec's server speaks HTTP/1 only; a client that opens an HTTP/2 connection (its preface,
``PRI * HTTP/2.0``) is told, in HTTP/2's own words, to use HTTP/1.1: an empty SETTINGS frame (a
server's connection preface), then GOAWAY with HTTP_1_1_REQUIRED, and the connection closes.

sglang-router sends one: where a worker's ``/health`` is not 2xx (a replica loading or draining: 503),
its worker detection tries gRPC on the same port. uvicorn, given those bytes, logged ``WARNING: Invalid
HTTP request received.`` on every retry."""

from __future__ import annotations

from uvicorn.protocols.http.auto import AutoHTTPProtocol

H2_PREFACE_START = b"PRI * HTTP/2.0"
#: an empty SETTINGS frame, then GOAWAY: last stream 0, error HTTP_1_1_REQUIRED (0xd)
H2_GO_AWAY = (
    bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])
    + bytes([0, 0, 8, 0x7, 0, 0, 0, 0, 0])
    + bytes(4)
    + (0xD).to_bytes(4, "big")
)


class Http1Protocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP/1 protocol, answering an HTTP/2 preface with `H2_GO_AWAY` instead of an
    invalid-request warning (``uvicorn.Config(http=Http1Protocol)``)."""

    _is_first_data = True

    def data_received(self, data: bytes) -> None:
        if self._is_first_data:
            self._is_first_data = False
            if data.startswith(H2_PREFACE_START):
                self.transport.write(H2_GO_AWAY)
                self.transport.close()
                return
        super().data_received(data)

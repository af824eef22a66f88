"""The server's port: one listening socket, answered while the model loads and then by the real server,
and HTTP/2 told to use HTTP/1.1 on it.

- While the model loads the port already answers: every HTTP request with 503 ``{"status":
  "loading"}`` and a ``Retry-After`` (a router or a readiness probe sees a replica that is not ready,
  not a refused connection); a port in use fails at once, not after the load. The socket then passes
  to the real server, so a connection made in the handover waits in its backlog, not refused.
- The server speaks HTTP/1 only; a client that opens an HTTP/2 connection (its preface, ``PRI *
  HTTP/2.0``) is told, in HTTP/2's own words, to use HTTP/1.1: an empty SETTINGS frame, then GOAWAY
  with HTTP_1_1_REQUIRED. sglang-router sends one: where a worker's ``/health`` is not 2xx (loading or
  draining: 503) or its connection is refused, its worker detection tries gRPC on the same port, which
  uvicorn logged as ``WARNING: Invalid HTTP request received.`` on every retry. The loading answer
  (asyncio's, a few lines of HTTP) and the real server (`Http1Protocol`, uvicorn's protocol) both do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading

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


MAX_HEAD_BYTES = 64 * 1024  #: a request head longer than this is answered without reading the rest
MAX_DRAINED_BYTES = 1 << 20  #: of a request body, read before the answer (so the close does not reset it)
READ_TIMEOUT_S = 10.0
CLIENT_CLOSE_WAIT_S = 2.0  #: after the answer, how long the client may take to close its side
RETRY_AFTER_S = 5
BODY = json.dumps(
    {"status": "loading", "error": {"message": "the model is loading", "type": "server_error"}}
).encode()


def listening_socket(host: str, port: int) -> socket.socket:
    """``host:port`` bound and listening, for the loading answer and then the real server in turn: the
    one socket passes from one to the other, so a connection made in between waits in its backlog
    instead of being refused (a refused health check sent sglang-router on to its gRPC probe, which
    reached the real server)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        raise ValueError(f"the server could not start on {host}:{port} (is the port in use?): {exc}") from exc
    return sock


@contextlib.contextmanager
def answering_loading(host: str, port: int, sock: socket.socket | None = None):
    """Answer 503 ``{"status": "loading"}`` on every path of ``host:port`` (or on ``sock``, which stays
    open and listening for the next server) while the block runs; a ValueError at once where the port
    cannot be had. On leaving, every connection is answered and closed before the port is let go."""
    own = sock is None
    sock = listening_socket(host, port) if own else sock
    loop = asyncio.new_event_loop()
    listener = sock.dup()  # (closed when loading ends; the next server takes the original)
    listener.setblocking(False)
    answering: set[asyncio.Task] = set()

    def accept_waiting() -> None:
        """(On the loop, when the socket is readable.) Every connection waiting is accepted and gets
        its task at once, in this callback: none is ever accepted and then left unanswered. (asyncio's
        own server accepted several per wake-up and created their transports later; those accepted
        just before it closed were reset.)"""
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # (BlockingIOError: none waits any more)
                return
            task = loop.create_task(_answer_connection(connection))
            answering.add(task)
            task.add_done_callback(answering.discard)

    loop.call_soon_threadsafe(loop.add_reader, listener.fileno(), accept_waiting)
    thread = threading.Thread(target=loop.run_forever, name="specexec-loading", daemon=True)
    thread.start()
    try:
        yield
    finally:

        async def close() -> None:
            # no accept after this (a connection not accepted yet waits in the backlog for the next
            # server); every one accepted is answered and closed
            loop.remove_reader(listener.fileno())
            listener.close()
            deadline = loop.time() + READ_TIMEOUT_S + CLIENT_CLOSE_WAIT_S
            while answering and loop.time() < deadline:
                await asyncio.wait(set(answering), timeout=deadline - loop.time())

        asyncio.run_coroutine_threadsafe(close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        if own:
            sock.close()


async def _answer_connection(connection: socket.socket) -> None:
    try:
        reader, writer = await asyncio.open_connection(sock=connection)
    except OSError:
        connection.close()
        return
    await _answer(reader, writer)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT_S)
        if head.startswith(H2_PREFACE_START):
            writer.write(H2_GO_AWAY)
        else:
            await asyncio.wait_for(_drain_body(reader, head), READ_TIMEOUT_S)
            writer.write(_loading_response(is_head=head.startswith(b"HEAD ")))
        await writer.drain()
        # the client closes first (as the answer asks), so the port's TIME_WAIT is its side's, and the
        # real server binds it at once
        await asyncio.wait_for(reader.read(), CLIENT_CLOSE_WAIT_S)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        pass  # a client gone or silent: nothing to answer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return await reader.read(MAX_HEAD_BYTES)


async def _drain_body(reader: asyncio.StreamReader, head: bytes) -> None:
    """Read what the head's Content-Length announces (up to `MAX_DRAINED_BYTES`)."""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            await reader.readexactly(min(int(value), MAX_DRAINED_BYTES))
            return


def _loading_response(is_head: bool) -> bytes:
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json\r\n"
        f"retry-after: {RETRY_AFTER_S}\r\n"
        f"content-length: {len(BODY)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head if is_head else head + BODY

"""While the model loads, the port already answers: every HTTP request with 503 ``{"status":
"loading"}`` and a ``Retry-After`` (a router or a readiness probe sees a replica that is not ready, not
a refused connection), and a port in use fails at once, not after the load.

sglang-router's worker detection asks ``/health`` over HTTP and, where that answer is not 2xx (a loading
replica's 503), tries gRPC on the same port: it opens an HTTP/2 connection with its preface
(``PRI * HTTP/2.0``). Answered by uvicorn, which speaks HTTP/1 only, each probe logged ``WARNING:
Invalid HTTP request received.``, dozens of times while a replica loaded. This listener (asyncio's, a
few lines of HTTP) answers both: an HTTP/1 request with the 503, the HTTP/2 preface with HTTP/2's own
"use HTTP/1.1" (`http2_refusal.py`, as the real server does too), so the probe fails at once and nothing
is logged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading

from .http2_refusal import H2_GO_AWAY, H2_PREFACE_START

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
    answering: set[asyncio.Task] = set()

    async def on_connection(reader, writer) -> None:
        task = asyncio.current_task()
        answering.add(task)
        try:
            await _answer(reader, writer)
        finally:
            answering.discard(task)

    # (a duplicate: asyncio closes the socket it served on, the next server takes the original)
    server = loop.run_until_complete(asyncio.start_server(on_connection, sock=sock.dup()))
    thread = threading.Thread(target=loop.run_forever, name="specexec-loading", daemon=True)
    thread.start()
    try:
        yield
    finally:

        async def close() -> None:
            server.close()
            await server.wait_closed()
            if answering:
                await asyncio.wait(set(answering), timeout=READ_TIMEOUT_S + CLIENT_CLOSE_WAIT_S)

        asyncio.run_coroutine_threadsafe(close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        if own:
            sock.close()


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

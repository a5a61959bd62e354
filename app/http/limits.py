"""What a connection to ``ragidx serve`` may cost: a deadline to send each request and a cap on
connections.

uvicorn times out a kept-alive connection between requests, but not one that sends a request's
head or body slowly: 500 connections trickling headers held every file descriptor, and normal
requests then timed out. Here each request (head and body) must arrive within a deadline from
the moment the connection opened or the previous response went out. Past a cap of connections,
a request is answered ``503`` with ``Retry-After`` (clients retry; a reset tells them nothing), and
past :data:`HARD_CAP_FACTOR` times the cap a connection is closed at once, so a flood cannot take
every file descriptor (the slow ones are reaped within the deadline, so the cap frees itself).
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_SECONDS = 10.0  # to send one request, head and body (loopback clients take milliseconds)
MAX_CONNECTIONS = 128
HARD_CAP_FACTOR = 4
RETRY_AFTER_SECONDS = 1


async def busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer to a request over the connection cap: 503, try again shortly, then close."""
    detail = json.dumps(
        {"detail": f"the server has all the connections it takes: retry after {RETRY_AFTER_SECONDS} s"}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(detail)).encode()),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": detail})


def no_delay(transport: asyncio.Transport) -> None:
    """Send each response at once: asyncio sets TCP_NODELAY only on sockets made with
    ``IPPROTO_TCP`` named, and without it a response's body waited for the client's delayed
    acknowledgement of its head, 40 ms on Linux (every request took 44 ms or more)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def limited_protocol(
    request_seconds: float = REQUEST_SECONDS, max_connections: int = MAX_CONNECTIONS
) -> type:
    """uvicorn's h11 protocol with those limits (pass it as ``uvicorn.Config(http=...)``)."""

    class LimitedProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            no_delay(transport)
            if len(self.connections) > HARD_CAP_FACTOR * max_connections:
                transport.close()
                return
            if len(self.connections) > max_connections:
                self.app = busy  # its request, once read, is answered 503
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline: Any = self.loop.call_later(request_seconds, self._expire)

        def _disarm(self) -> None:
            deadline = getattr(self, "_deadline", None)
            if deadline is not None:
                deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            """Close a connection whose request has not fully arrived (head or body) in time."""
            self._deadline = None
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self.transport.close()

    return LimitedProtocol

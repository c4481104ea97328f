"""Connection-level protection below the ASGI app: a cap on open connections and a deadline
for request headers (slowloris).

uvicorn's own ``limit_concurrency`` does not count WebSocket upgrades and answers with a
plain-text 503, and its HTTP protocols have no deadline for a request's headers: a client
that opens a connection and sends nothing, or a header byte at a time, holds it forever
(every byte also cancels the keep-alive timer). ``guarded_protocol`` returns a subclass of
uvicorn's ``HttpToolsProtocol`` (``H11Protocol`` without httptools) that

- refuses a connection past ``server.max_connections`` open ones (HTTP keep-alive and
  WebSocket alike): its first request, a WebSocket upgrade included, gets a 503
  ``{"error": {..., "code": "too_many_connections"}}`` with ``Connection: close``;
- closes a connection whose request headers are not complete ``server.header_timeout``
  seconds after it opened or after its previous response ended (a 408 error object is
  sent first when some bytes of a request had arrived);
- answers 431 and closes when a request's line and headers pass ``MAX_HEAD`` bytes
  (httptools itself buffers them without a limit).

``server.send_buffer_bytes`` sets each connection's kernel send buffer and its transport's
high-water mark (otherwise OS autotuning, up to megabytes, and 64 KiB): what a client that
stops reading holds before its stream waits; ``EngineClient`` then bounds the steps
queued behind it. Slow bodies are cut by ``read_json`` (``server.body_timeout``, 408).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # llhttp through httptools: a C parser, and a send path far shorter than h11's
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    BASE: type[Any] = HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 stays the fallback
    BASE = H11Protocol

log = logging.getLogger("llamaserve.connections")
MAX_REFUSED_HEAD = 64 * 1024  # request-head bytes read from a refused connection
MAX_HEAD = 64 * 1024  # a request line and headers, in all (431 past it)


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1024
    header_timeout: float = 10.0
    send_buffer: int | None = None  # SO_SNDBUF of each connection (None: OS autotuning)


def canned(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-style error body, closing the connection."""
    kind = "server_error" if status >= 500 else "timeout_error" if status == 408 \
        else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    return head + body


def guarded_protocol(limits: ConnectionLimits, base: type[Any] = BASE) -> type[Any]:
    """uvicorn's HTTP protocol (``base``: httptools', else h11's) with the guards."""

    class GuardedProtocol(base):  # type: ignore[misc]
        """uvicorn's HTTP protocol with a connection cap and a header deadline."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if limits.send_buffer is not None:
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.send_buffer)
                # uvicorn awaits the transport's drain past this (64 KiB by default)
                transport.set_write_buffer_limits(high=limits.send_buffer)  # type: ignore[attr-defined]
            self.refused = len(self.connections) > limits.max_connections
            self.refused_head = b""
            self.seen_bytes = False
            self.head_bytes = 0
            self.header_timer: asyncio.TimerHandle | None = None
            self.waiting_cycle: Any = None
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self.waiting_cycle = self.cycle
            self.seen_bytes = False
            self.head_bytes = 0
            self.header_timer = self.loop.call_later(limits.header_timeout, self._expired)

        def _disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _answered_body_arriving(self) -> bool:
            """The guards re-arm when a response completes; a request answered before its
            body was read (an error, a route that ignores the body) may still be sending
            that body, which is not the next request's head."""
            cycle = self.waiting_cycle
            return cycle is not None and cycle is self.cycle and bool(cycle.more_body)

        def _expired(self) -> None:
            self.header_timer = None
            if self.transport.is_closing():
                return
            if self.seen_bytes and not self._answered_body_arriving():
                self.transport.write(canned(408, "Request Timeout", "header_timeout",
                                            "Request headers not received within "
                                            f"{limits.header_timeout:g} s"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.refused:
                self._refuse(data)
                return
            self.seen_bytes = True
            draining = self._answered_body_arriving()
            super().data_received(data)
            if self.header_timer is None:
                return
            if self.cycle is not self.waiting_cycle or self.transport.get_protocol() \
                    is not self:  # headers complete: a new cycle, or upgraded to WebSocket
                self._disarm()
                return
            if self._answered_body_arriving():
                return  # the rest of a request answered before its body was read
            if draining:  # that body just ended: the next head starts now, on its own clock
                self._arm()
                return
            # still in the request's head: httptools buffers headers without a limit (h11
            # stopped at 16 KiB), so a fast client could fill memory within the deadline
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD and not self.transport.is_closing():
                self._disarm()
                self.transport.write(canned(431, "Request Header Fields Too Large",
                                            "headers_too_large",
                                            f"Request headers over {MAX_HEAD} bytes"))
                self.transport.close()

        def _refuse(self, data: bytes) -> None:
            """Over the cap: read up to the end of the request headers, answer 503."""
            self.refused_head += data
            if len(self.refused_head) > MAX_REFUSED_HEAD:
                self.transport.close()
                return
            if b"\r\n\r\n" in self.refused_head and not self.transport.is_closing():
                log.warning("refused a connection past server.max_connections = %d",
                            limits.max_connections)
                self.transport.write(canned(
                    503, "Service Unavailable", "too_many_connections",
                    f"The server has {limits.max_connections} open connections, its limit; "
                    "retry shortly."))
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle is not None \
                    and self.cycle.response_complete:
                self._arm()  # the next request's headers have header_timeout to arrive

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedProtocol

"""Watching the TCP connections llama.cpp's RPC client holds, without using them.

ggml-rpc keeps one connection per RPC server for as long as anything of the model lives
there. It notices a dead server only when it next sends or receives, and then aborts
the process; a server whose host vanishes without closing the connection (power loss,
a network partition) leaves its send or receive blocked for good. This module finds
those connections among the process's file descriptors (by peer address), turns on TCP
keepalive and a user timeout on them, so the kernel fails a connection to a host that
no longer answers, and polls them: a peer that closed (``POLLRDHUP``) or a connection
error (``POLLERR`` / ``POLLHUP``) is reported at once, also while no request runs.

Probing the servers with connections of our own would not work: ``rpc-server`` serves
one client at a time with a listen backlog of one, so probes queue behind the model's
connection and time out although the server is fine.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

# a host that stops answering: keepalive probes after 10 s idle, every 5 s, 3 missed ->
# the connection fails after about 25 s; data unacknowledged for 30 s fails it too
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3
USER_TIMEOUT_MS = 30_000
_RDHUP = getattr(select, "POLLRDHUP", 0)  # Linux; elsewhere POLLHUP / POLLERR only
_WATCHED = _RDHUP | select.POLLERR | select.POLLHUP

Address = tuple[str, int]


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def resolve(endpoint: str) -> Address:
    """The IPv4 address llama.cpp connects to (it uses ``gethostbyname``)."""
    host, port = split_endpoint(endpoint)
    return socket.gethostbyname(host), port


def _fds() -> list[int]:
    for where in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return [int(name) for name in os.listdir(where)]
    return list(range(3, 1024))


def peer_of(fd: int) -> Address | None:
    """The IPv4 peer of a connected TCP socket ``fd``; None for anything else. The
    descriptor stays as it is (wrapped, then detached, never closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
            return None
        host, port = sock.getpeername()[:2]
        return str(host), int(port)
    except OSError:
        return None
    finally:
        sock.detach()


def connections_to(address: Address) -> list[int]:
    """File descriptors of this process connected to ``address``."""
    return [fd for fd in _fds() if peer_of(fd) == address]


def harden(fd: int) -> None:
    """TCP keepalive and a user timeout on ``fd``: the kernel fails the connection when
    the peer's host stops answering, which unblocks llama.cpp's send / receive."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE),
                            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
                            ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        pass
    finally:
        sock.detach()


@dataclass
class _Conn:
    fd: int
    inode: int  # the socket's identity: the descriptor number may be reused after a close


class ConnectionWatch:
    """Polls the connections to ``endpoints`` on a thread; ``on_down(endpoint, why)`` once
    per endpoint whose connection the peer closed or that failed."""

    def __init__(self, endpoints: tuple[str, ...], on_down: Callable[[str, str], None],
                 interval: float = 0.5) -> None:
        self.addresses = {ep: resolve(ep) for ep in endpoints}
        self.on_down = on_down
        self.interval = interval
        self.down: dict[str, str] = {}
        self._conns: dict[str, _Conn] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.check(0)
        self._thread = threading.Thread(target=self._run, name="llamaserve-rpc-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def watching(self) -> list[str]:
        """Endpoints with a connection found (the others hold nothing of the model now)."""
        return sorted(self._conns)

    def _run(self) -> None:
        while not self._stop.is_set():
            for endpoint, why in self.check(self.interval).items():
                self.on_down(endpoint, why)

    def check(self, timeout: float = 0) -> dict[str, str]:
        """One round: find connections not known yet, wait up to ``timeout`` seconds for
        any to close or fail; returns the endpoints newly found down and why."""
        with self._lock:
            self._find()
            poll = select.poll()
            by_fd: dict[int, str] = {}
            for endpoint, known in self._conns.items():
                poll.register(known.fd, _WATCHED)
                by_fd[known.fd] = endpoint
        events = poll.poll(int(timeout * 1000)) if by_fd else []
        if not by_fd and timeout:
            self._stop.wait(timeout)
        found: dict[str, str] = {}
        with self._lock:
            for fd, event in events:
                endpoint = by_fd[fd]
                conn = self._conns.get(endpoint)
                if conn is None or endpoint in self.down:
                    continue
                if event & select.POLLNVAL or not self._same(conn):
                    del self._conns[endpoint]  # llama.cpp closed it (model freed): not a failure
                    continue
                why = ("dropped the connection (reset or timed out)"
                       if event & (select.POLLERR | select.POLLHUP) else "closed the connection")
                self.down[endpoint] = found[endpoint] = why
        return found

    def _find(self) -> None:
        for endpoint, address in self.addresses.items():
            conn: _Conn | None = self._conns.get(endpoint)
            if conn is not None and not self._same(conn):
                del self._conns[endpoint]
                conn = None
            if conn is None and endpoint not in self.down:
                fds = connections_to(address)
                if fds:
                    harden(fds[0])
                    self._conns[endpoint] = _Conn(fds[0], os.fstat(fds[0]).st_ino)

    @staticmethod
    def _same(conn: _Conn) -> bool:
        try:
            return os.fstat(conn.fd).st_ino == conn.inode
        except OSError:
            return False

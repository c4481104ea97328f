"""One model across machines: its layers on llama.cpp RPC servers (``model.rpc_servers``).

``RpcBackend.connect`` checks each server (a handshake of our own, so an unreachable
server, one busy with another client or one of another protocol version is a start-up
error naming it instead of llama.cpp aborting or waiting forever), adds it through the
RPC backend's ``ggml_backend_rpc_add_server`` — as llama.cpp's ``--rpc`` does — and
lists its devices for ``llama_model_params.devices``: the RPC devices first, then any
local GPUs (llama.cpp's own default order). Layers not offloaded (``n_gpu_layers``)
stay on this machine's CPU; ``split_mode``, ``tensor_split`` and ``main_gpu`` decide how
the offloaded ones are split. The RPC backend is not registered process-wide, so other
models of the same process do not land on these servers.

A server that dies while serving: ggml-rpc aborts the process when a send or receive
fails. ``watch`` installs a ggml abort callback that reports the failure to the engine
(naming the server) and then blocks the aborting thread instead of returning into
``abort()``; a ``ConnectionWatch`` notices a closed or failed connection while idle.
Either way the engine fails its requests with ``BackendUnavailable`` and stops
(``/healthz`` 503, exit 1 after ``server.engine_failure_exit``). Nothing of llama.cpp
that lives on the servers is freed after that (it would wait on the dead server).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import socket
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.backends import ggml
from engine.backends.rpc_watch import ConnectionWatch, connections_to, resolve, split_endpoint

log = logging.getLogger("llamaserve.rpc")

# ggml/include/ggml-rpc.h of the llama.cpp the bindings vendor (0.3.36): a client of
# protocol 7.0 talks to servers of 7.0 only (same major, minor not newer)
RPC_PROTO_MAJOR, RPC_PROTO_MINOR = 7, 0
_CMD_HELLO = 14
_CONN_CAPS = 24  # rpc_msg_hello_req: conn_caps[24]; rsp: major, minor, patch, pad, caps

OnDown = Callable[[str, tuple[str, ...]], None]  # (reason, endpoints down)


class RpcError(RuntimeError):
    """An RPC server cannot be used (start-up)."""


def not_built_message() -> str:
    try:
        from llama_cpp import __version__ as version
    except ImportError:
        version = "<version>"
    return ("llama-cpp-python was built without the RPC backend; rebuild it with: "
            "CMAKE_ARGS=\"-DGGML_RPC=on\" pip install --no-cache-dir --force-reinstall "
            f"--no-deps llama-cpp-python=={version}")


def supports_rpc() -> bool:
    """The bindings' ggml has the RPC backend (built with -DGGML_RPC=on)."""
    try:
        return ggml.reg_by_name("RPC") is not None
    except (ImportError, AttributeError, OSError):
        return False


def hello(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """rpc-server's HELLO handshake on a connection of our own; the server's protocol
    version. Raises RpcError naming the endpoint."""
    host, port = split_endpoint(endpoint)
    where = f"model.rpc_servers: RPC server {endpoint}"
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        raise RpcError(f"{where}: cannot resolve {host!r}: {exc}") from None
    try:
        sock = socket.create_connection((address, port), timeout)
    except OSError as exc:
        raise RpcError(f"{where} is unreachable: {exc.strerror or exc}") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS) + bytes(_CONN_CAPS))
            head = _recv(sock, 8)
            (size,) = struct.unpack("<Q", head)
            reply = _recv(sock, size) if size == 4 + _CONN_CAPS else b""
        except TimeoutError:
            raise RpcError(f"{where} accepted the connection but did not answer in "
                           f"{timeout:g} s (rpc-server serves one client at a time: is "
                           "another client connected to it?)") from None
        except OSError as exc:
            raise RpcError(f"{where}: the handshake failed: {exc.strerror or exc} (is it "
                           "an rpc-server of the same llama.cpp version?)") from None
    if not reply:
        raise RpcError(f"{where} did not answer like an rpc-server of this llama.cpp "
                       "version")
    major, minor, patch = reply[0], reply[1], reply[2]
    if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
        raise RpcError(f"{where} speaks RPC protocol {major}.{minor}.{patch}; these bindings "
                       f"speak {RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: build rpc-server from "
                       "the llama.cpp sources llama-cpp-python vendors")
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


@dataclass(frozen=True)
class RpcDevice:
    endpoint: str
    name: str  # ggml's device name, RPC0, RPC1, ... in the order servers were added
    handle: int


class RpcBackend:
    """The RPC servers of one model and their devices."""

    def __init__(self, endpoints: tuple[str, ...], devices: list[RpcDevice],
                 local: list[int]) -> None:
        self.endpoints = endpoints
        self.devices = devices
        self.local = local  # this machine's GPUs, after the RPC devices
        self.failure: str | None = None
        self._on_down: OnDown | None = None
        self._watch: ConnectionWatch | None = None
        self._report_lock = threading.Lock()

    @classmethod
    def connect(cls, endpoints: tuple[str, ...], timeout: float = 5.0) -> RpcBackend:
        if not supports_rpc():
            raise RpcError(f"model.rpc_servers: {not_built_message()}")
        _install_abort_handler()  # from here on a GGML_ABORT is reported, not a crash
        reg = ggml.reg_by_name("RPC")
        assert reg is not None
        add = ggml.proc_address(reg, "ggml_backend_rpc_add_server", ggml.AddServer)
        if add is None:
            raise RpcError("model.rpc_servers: this ggml's RPC backend has no "
                           "ggml_backend_rpc_add_server")
        devices: list[RpcDevice] = []
        for endpoint in endpoints:
            if not connections_to(resolve(endpoint)):  # not connected yet (another model)
                major, minor, patch = hello(endpoint, timeout)
                log.info("RPC server %s: protocol %d.%d.%d", endpoint, major, minor, patch)
            server = add(endpoint.encode())
            if not server:
                raise RpcError(f"model.rpc_servers: RPC server {endpoint} has no devices")
            devices += [RpcDevice(endpoint, ggml.dev_name(d), d)
                        for d in ggml.reg_devices(server)]
        local = [d for d in ggml.all_devices() if ggml.dev_type(d) == ggml.DEVICE_GPU] or \
            [d for d in ggml.all_devices() if ggml.dev_type(d) == ggml.DEVICE_IGPU][:1]
        return cls(endpoints, devices, local)

    def device_array(self) -> Any:
        """The NULL-terminated ``ggml_backend_dev_t`` list for ``llama_model_params``."""
        handles = [d.handle for d in self.devices] + self.local
        return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)

    def describe(self) -> str:
        return ", ".join([f"{d.name} ({d.endpoint})" for d in self.devices]
                         + [ggml.dev_name(d) for d in self.local])

    @property
    def broken(self) -> bool:
        """A server of this model failed, or llama.cpp aborted: what lives on the servers
        must not be touched (freeing it would wait on a dead server)."""
        return self.failure is not None or bool(_aborted) or any(
            e in _failed for e in self.endpoints)

    # -- failure reporting ----------------------------------------------------------
    def watch(self, on_down: OnDown) -> None:
        """Report a failed server (and any llama.cpp abort) to ``on_down`` once."""
        self._on_down = on_down
        self._watch = ConnectionWatch(self.endpoints, self._closed)
        self._watch.start()
        _listeners.append(self)
        log.info("watching the connections to %s", ", ".join(self._watch.watching()) or
                 "(none yet)")

    def unwatch(self) -> None:
        with contextlib.suppress(ValueError):
            _listeners.remove(self)
        if self._watch is not None:
            self._watch.stop()

    def _closed(self, endpoint: str, why: str) -> None:
        self._report(f"RPC server {endpoint} {why}", (endpoint,))

    def _aborted(self, message: str) -> None:
        down = dict(self._watch.check(0)) if self._watch is not None else {}
        if self._watch is not None:
            down = {**self._watch.down, **down}
        where = "; ".join(f"RPC server {e} {why}" for e, why in down.items()) or \
            f"RPC servers {', '.join(self.endpoints)}"
        self._report(f"{where} (llama.cpp aborted: {message})", tuple(down) or self.endpoints)

    def _report(self, reason: str, endpoints: tuple[str, ...]) -> None:
        with self._report_lock:
            if self.failure is not None:
                return
            self.failure = reason
            _failed.update(endpoints)
        log.error("%s", reason)
        if self._on_down is not None:
            self._on_down(reason, endpoints)


# -- ggml aborts ------------------------------------------------------------------------
_listeners: list[RpcBackend] = []  # watched backends, told about an abort
_failed: set[str] = set()  # endpoints found down, process-wide
_aborted: list[str] = []
_handler: Any = None  # the installed ctypes callback (kept alive)


def _install_abort_handler() -> None:
    global _handler
    if _handler is None:
        _handler = ggml.AbortCallback(_on_abort)
        ggml.set_abort_callback(_handler)


def _on_abort(raw: bytes | None) -> None:
    """ggml is about to ``abort()`` (an RPC send / receive failed, or any GGML_ABORT):
    tell the engines, then never return. Runs on the aborting thread — usually ggml-rpc's
    dispatcher thread, whose caller (the engine thread, inside llama_decode) then waits
    for good; the engine's watchdog fails its requests instead."""
    try:
        message = re.sub(r"^\S*/", "", (raw or b"").decode("utf-8", "replace").strip())
        _aborted.append(message)
        log.error("llama.cpp aborted: %s", message)
        listeners = list(_listeners)
        if not listeners:  # loading, or nothing to report to: exit, never silently
            sys.stderr.write(f"llamaserve: llama.cpp aborted: {message}\n")
            sys.stderr.flush()
            os._exit(1)
        for backend in listeners:
            backend._aborted(message)
    except BaseException:
        log.exception("reporting a llama.cpp abort failed")
    threading.Event().wait()  # returning would abort() the process

"""Start-up and shutdown around the app: load in the background, drain on signals.

``Lifecycle`` is the ASGI app uvicorn runs. The port opens at once and answers 503
(``/healthz``: ``{"status": "loading"}``) while the model loads on a worker thread;
then requests go to the real app. A model that fails to load stops the server with
exit status 1.

``DrainingServer`` replaces uvicorn's signal handling: SIGTERM / SIGINT start a
drain — ``/healthz`` answers 503 ``draining``, new API requests get 503, in-flight
requests may finish for up to ``server.drain_timeout`` seconds, then the rest are
cancelled, the engine stops (flushing the disk-cache writer) and the process exits 0.
SIGUSR1 drains the same way but waits for every in-flight request, however long,
for supervisor-driven rolling restarts. A second SIGTERM / SIGINT stops at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from api.web.errors import ollama_error, ollama_route
from api.web.gate import Receive, Scope, Send
from api.web.state import ServerState

log = logging.getLogger("llamaserve.server")


EXIT_BACKSTOP = 30.0  # seconds a shutdown after an engine failure may take


def exit_after(seconds: float) -> None:
    """Exit 1 in ``seconds`` unless the process ended by then: a shutdown held up by a
    thread stuck in llama.cpp (waiting on a dead RPC server) still ends, and says so."""

    def run() -> None:
        time.sleep(seconds)
        print(f"llamaserve: shutdown did not finish in {seconds:g} s; exiting now",
              file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=run, name="llamaserve-exit", daemon=True).start()


class Lifecycle:
    def __init__(self, load: Callable[[], Starlette]) -> None:
        self.load = load
        self.app: Starlette | None = None
        self.server: DrainingServer | None = None
        self.exit_code = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None

    @property
    def state(self) -> ServerState | None:
        return self.app.state.llama if self.app is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            health = scope["path"] in ("/healthz", "/health")
            message = "The model is still loading; retry shortly."
            body = json.dumps({"status": "loading"} if health else ollama_error(message)
                              if ollama_route(scope["path"]) else {"error": {
                                  "message": message, "type": "server_error", "param": None,
                                  "code": "loading"}}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.loop = asyncio.get_running_loop()
                self._task = asyncio.ensure_future(self._load())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                state = self.state
                if state is not None and state.batches is not None:
                    state.batches.stop()
                if state is not None and state.background is not None:
                    state.background.stop()
                if state is not None:
                    await asyncio.get_running_loop().run_in_executor(None,
                                                                     state.registry.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _load(self) -> None:
        assert self.loop is not None
        try:
            app = await self.loop.run_in_executor(None, self.load)
        except Exception as exc:
            print(f"llamaserve: cannot start: {exc}", file=sys.stderr)
            self.exit_code = 1
            if self.server is not None:
                self.server.should_exit = True
            return
        app.state.llama.start()
        self.app = app
        log.info("model loaded; serving")
        await self._watch_engine(app.state.llama)

    async def _watch_engine(self, state: ServerState) -> None:
        """If the engine thread dies, requests already fail (500/503) and /healthz says
        503; after ``server.engine_failure_exit`` seconds the process exits with status 1
        so a supervisor (systemd ``Restart=on-failure``) starts a fresh one."""
        delay = state.config.server.engine_failure_exit
        failure = None
        while failure is None:
            if self.server is not None and self.server.should_exit:
                return
            await asyncio.sleep(0.25)
            failure = next((m.model.failure for m in state.registry.loaded_states()
                            if not m.model.alive and m.model.failure), None)
        if delay is None:
            log.error("engine failed (%s); serving 503 until restarted", failure)
            return
        log.error("engine failed (%s); exiting with status 1 in %g s", failure, delay)
        await asyncio.sleep(delay)
        print(f"llamaserve: engine failed: {failure}", file=sys.stderr)
        self.exit_code = 1
        if self.server is not None:
            self.server.should_exit = True
        exit_after(EXIT_BACKSTOP)

    # -- draining -----------------------------------------------------------------------
    def drain(self, timeout: float | None) -> None:
        """Called from a signal handler (main thread, the loop's thread)."""
        if self.loop is None:
            return
        self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain(timeout)))

    async def _drain(self, timeout: float | None) -> None:
        state, server = self.state, self.server
        assert server is not None
        if state is None:  # still loading: nothing to drain
            server.should_exit = True
            return
        state.gate.draining = True
        if state.background is not None and state.background.store.can_claim:
            state.background.stop()  # handed over: the next server on the store resumes them
        log.warning("draining: %d request(s) in flight%s", state.gate.in_flight,
                    f", up to {timeout:g} s" if timeout is not None else "")
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._busy(state) and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(0.05)
        if self._busy(state):
            models = state.registry.loaded_states()
            log.warning("drain timeout: cancelling %d sequence(s)",
                        sum(m.client.outstanding for m in models))
            for m in models:
                m.client.cancel_all()
            end = time.monotonic() + 5
            while self._busy(state) and time.monotonic() < end:
                await asyncio.sleep(0.05)
        server.should_exit = True

    @staticmethod
    def _busy(state: ServerState) -> bool:
        return state.gate.in_flight > 0 or any(
            m.client.outstanding > 0 for m in state.registry.loaded_states())


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle,
                 drain_timeout: float) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_timeout = drain_timeout
        self.draining = False
        lifecycle.server = self

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not recorded in _captured_signals: uvicorn would re-raise it after shutdown and
        # the process would die of the signal instead of exiting 0
        if self.draining and sig != signal.SIGUSR1:
            self.should_exit = self.force_exit = True
            return
        if not self.draining:
            self.draining = True
            self.lifecycle.drain(None if sig == signal.SIGUSR1 else self.drain_timeout)

    def install_sigusr1(self) -> None:
        signal.signal(signal.SIGUSR1, self.handle_exit)


def run(lifecycle: Lifecycle, host: str, port: int, log_level: str,
        drain_timeout: float, **uvicorn_args: Any) -> int:
    config = uvicorn.Config(lifecycle, host=host, port=port, log_level=log_level,
                            access_log=False, timeout_graceful_shutdown=5, lifespan="on",
                            **uvicorn_args)
    server = DrainingServer(config, lifecycle, drain_timeout)
    server.install_sigusr1()
    server.run()
    return lifecycle.exit_code

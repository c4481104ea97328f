"""A persistent CPU threadpool for a llama.cpp context, as llama-server attaches one.

Without one, ggml's CPU backend makes a disposable threadpool for every graph it computes:
each ``llama_decode`` starts and joins its worker threads. Where a decode step is short (a
small model, or a GPU doing the arithmetic while the CPU runs what is left) that start-up
is a visible share of the step. ``attach`` creates pools of ``n_threads`` (and
``n_threads_batch`` when it differs) through the CPU backend's own ``ggml_threadpool_new``,
with ggml's default parameters (as ``common``'s, llama-server's, are), and attaches them
with ``llama_attach_threadpool``; ``Threadpools.free`` releases them after the context.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

from engine.backends import ggml

log = logging.getLogger("llamaserve.runner")

GGML_MAX_N_THREADS = 512
POLL = 0  # ggml's default 50 spins idle workers, taking the cores the Python threads need


class ThreadpoolParams(ctypes.Structure):
    """``struct ggml_threadpool_params`` (ggml.h)."""

    _fields_ = [("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32),
                ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


_New = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ThreadpoolParams))
_Free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass
class Threadpools:
    pools: list[int]
    free_fn: Any

    def free(self) -> None:
        """Release the pools (after the context that used them is freed)."""
        for pool in self.pools:
            self.free_fn(pool)
        self.pools = []


def _params(n_threads: int, paused: bool = False) -> ThreadpoolParams:
    from llama_cpp import _ggml

    init = _ggml.libggml.ggml_threadpool_params_init
    init.argtypes = [ctypes.POINTER(ThreadpoolParams), ctypes.c_int]
    init.restype = None
    params = ThreadpoolParams()
    init(ctypes.byref(params), n_threads)
    params.paused = paused
    params.poll = POLL
    return params


def attach(ctx: Any, n_threads: int, n_threads_batch: int) -> Threadpools | None:
    """Create and attach the pools to ``ctx``; None (ggml's per-graph pools stay) if the
    CPU backend does not offer them."""
    try:
        import llama_cpp

        g = ggml.lib()
        cpu = g.ggml_backend_dev_by_type(ggml.DEVICE_CPU)
        if not cpu:
            return None
        reg = g.ggml_backend_dev_backend_reg(cpu)
        new = ggml.proc_address(reg, "ggml_threadpool_new", _New)
        free = ggml.proc_address(reg, "ggml_threadpool_free", _Free)
        lib = llama_cpp.llama_cpp._lib
        attach_fn = lib.llama_attach_threadpool
    except (AttributeError, OSError) as exc:
        log.info("no persistent threadpool: %s", exc)
        return None
    if new is None or free is None:
        return None
    attach_fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    attach_fn.restype = None
    batch = None
    if n_threads_batch != n_threads:
        batch = new(ctypes.byref(_params(n_threads_batch)))
        if not batch:
            return None
    pool = new(ctypes.byref(_params(n_threads, paused=batch is not None)))
    if not pool:
        if batch:
            free(batch)
        return None
    attach_fn(ctx, pool, batch)
    return Threadpools([p for p in (pool, batch) if p], free)

"""The ggml backend registry of the library llama-cpp-python loads, through ctypes.

The bindings declare llama.cpp's API, not ggml's backend registry (devices, backends and
their extra functions such as the RPC backend's ``ggml_backend_rpc_add_server``), nor
``ggml_set_abort_callback``, nor what reads a graph node's name and values. This module
declares those few functions on the very
``libggml`` the bindings loaded (``llama_cpp/lib``), so devices found here are the ones
``llama_model_params.devices`` takes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache
from typing import Any

# enum ggml_backend_dev_type
DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU, DEVICE_ACCEL = 0, 1, 2, 3

_c = ctypes
_P = _c.c_void_p
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "ggml_backend_reg_by_name": ([_c.c_char_p], _P),
    "ggml_backend_reg_name": ([_P], _c.c_char_p),
    "ggml_backend_reg_get_proc_address": ([_P, _c.c_char_p], _P),
    "ggml_backend_reg_dev_count": ([_P], _c.c_size_t),
    "ggml_backend_reg_dev_get": ([_P, _c.c_size_t], _P),
    "ggml_backend_dev_count": ([], _c.c_size_t),
    "ggml_backend_dev_get": ([_c.c_size_t], _P),
    "ggml_backend_dev_by_name": ([_c.c_char_p], _P),
    "ggml_backend_dev_by_type": ([_c.c_int], _P),
    "ggml_backend_dev_name": ([_P], _c.c_char_p),
    "ggml_backend_dev_description": ([_P], _c.c_char_p),
    "ggml_backend_dev_type": ([_P], _c.c_int),
    "ggml_backend_dev_backend_reg": ([_P], _P),
    "ggml_backend_dev_memory": ([_P, _c.POINTER(_c.c_size_t), _c.POINTER(_c.c_size_t)], None),
    "ggml_set_abort_callback": ([_P], _P),
    # a graph node seen by an eval callback (engine/embeddings/last_token.py)
    "ggml_get_name": ([_P], _c.c_char_p),
    "ggml_nelements": ([_P], _c.c_int64),
    "ggml_nbytes": ([_P], _c.c_size_t),
    "ggml_backend_tensor_get": ([_P, _P, _c.c_size_t, _c.c_size_t], None),
}

# void (*ggml_abort_callback_t)(const char * error_message)
AbortCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
# ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint)
AddServer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
# void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
#                                    size_t n_threads, size_t n_devices, ggml_backend_dev_t *)
StartServer = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                               ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))


@cache
def lib() -> Any:
    """libggml as the bindings loaded it, with the signatures above declared."""
    from llama_cpp import _ggml

    handle = _ggml.libggml
    for name, (args, res) in _SIGNATURES.items():
        fn = getattr(handle, name)
        fn.argtypes = args
        fn.restype = res
    return handle


def reg_by_name(name: str) -> int | None:
    reg: int | None = lib().ggml_backend_reg_by_name(name.encode())
    return reg


def proc_address(reg: int, name: str, kind: Callable[[int], Any]) -> Any:
    """A backend's extra function by name, as the ctypes prototype ``kind``; None if the
    backend does not have it."""
    address = lib().ggml_backend_reg_get_proc_address(reg, name.encode())
    return kind(address) if address else None


def reg_devices(reg: int) -> list[int]:
    g = lib()
    return [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]


def all_devices() -> list[int]:
    g = lib()
    return [g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count())]


def dev_name(dev: int) -> str:
    return str(lib().ggml_backend_dev_name(dev).decode("utf-8", "replace"))


def dev_description(dev: int) -> str:
    return str(lib().ggml_backend_dev_description(dev).decode("utf-8", "replace"))


def dev_type(dev: int) -> int:
    return int(lib().ggml_backend_dev_type(dev))


def dev_reg_name(dev: int) -> str:
    g = lib()
    return str(g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)).decode())


def dev_memory(dev: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def set_abort_callback(callback: Any) -> None:
    """Every GGML_ABORT / GGML_ASSERT of the process calls ``callback`` (an AbortCallback)
    with its message, then ``abort()`` unless the callback never returns. Keep a
    reference to it for as long as it is installed."""
    lib().ggml_set_abort_callback(ctypes.cast(callback, ctypes.c_void_p))

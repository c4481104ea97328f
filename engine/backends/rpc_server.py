"""``llamaserve rpc-server``: llama.cpp's ``rpc-server`` without building it.

It calls ``ggml_backend_rpc_start_server`` of the RPC-enabled ggml inside
llama-cpp-python — the function llama.cpp's ``tools/rpc/rpc-server.cpp`` calls, from
the same sources — with the same flags and the same device choice (every GPU-like
device, else the CPU). It serves one client at a time until killed.

    llamaserve rpc-server --host 0.0.0.0 --port 50052 --threads 8

RPC is unauthenticated and unencrypted: whoever reaches the port can run code paths of
ggml on the machine and read what it holds. Bind to loopback or a trusted network only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from pathlib import Path

from engine.backends import ggml

WARNING = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARNING: Host ('{host}') is != '127.0.0.1'
         Never expose the RPC server to an open network!
         This is an experimental feature and is not secure!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


def _threads(text: str) -> int:
    n = int(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"invalid number of threads: {n}")
    return n


def _port(text: str) -> int:
    n = int(text)
    if not 0 < n <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port: {n}")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llamaserve rpc-server",
        description="llama.cpp's rpc-server (ggml_backend_rpc_start_server of the ggml "
        "inside llama-cpp-python): lends this machine's devices to a llamaserve whose "
        "model.rpc_servers lists it. Unauthenticated: trusted networks only.")
    p.add_argument("-H", "--host", default="127.0.0.1", help="host to bind to "
                   "(default: 127.0.0.1)")
    p.add_argument("-p", "--port", type=_port, default=50052, help="port to bind to "
                   "(default: 50052)")
    p.add_argument("-t", "--threads", type=_threads,
                   default=max(1, (os.cpu_count() or 2) // 2),
                   help="threads of the CPU device (default: half the cores)")
    p.add_argument("-d", "--device", help="comma-separated devices (default: every GPU, "
                   "else the CPU)")
    p.add_argument("-c", "--cache", action="store_true",
                   help="keep received tensors in a local file cache ($LLAMA_CACHE/rpc or "
                   "~/.cache/llama.cpp/rpc), so a restart loads them from disk")
    return p


def _cache_dir() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]) / "rpc"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "llama.cpp" / "rpc"


def _devices(names: str | None) -> list[int]:
    if names:
        out = []
        for name in filter(None, names.replace("/", ",").split(",")):
            dev = ggml.lib().ggml_backend_dev_by_name(name.encode())
            if not dev:
                available = ", ".join(f"{ggml.dev_name(d)} ({ggml.dev_description(d)})"
                                      for d in ggml.all_devices())
                raise SystemExit(f"error: unknown device: {name}; available: {available}")
            out.append(dev)
        return out
    accelerated = [d for d in ggml.all_devices()
                   if ggml.dev_type(d) not in (ggml.DEVICE_CPU, ggml.DEVICE_ACCEL)]
    cpu = ggml.lib().ggml_backend_dev_by_type(ggml.DEVICE_CPU)
    return accelerated or ([cpu] if cpu else [])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.host != "127.0.0.1":
        print(WARNING.format(host=args.host), file=sys.stderr)
    from engine.backends.rpc import not_built_message, supports_rpc

    if not supports_rpc():
        print(f"llamaserve: {not_built_message()}", file=sys.stderr)
        return 1
    devices = _devices(args.device)
    if not devices:
        print("No devices found", file=sys.stderr)
        return 1
    cache_dir = None
    if args.cache:
        path = _cache_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"Failed to create cache directory: {path}: {exc.strerror}", file=sys.stderr)
            return 1
        cache_dir = str(path).encode()
    reg = ggml.reg_by_name("RPC")
    start = ggml.proc_address(reg, "ggml_backend_rpc_start_server", ggml.StartServer) \
        if reg else None
    if start is None:
        print("Failed to obtain RPC backend start server function", file=sys.stderr)
        return 1
    # the server loop never returns to Python: let Ctrl-C / SIGTERM end the process
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.stdout.flush()
    array = (ctypes.c_void_p * len(devices))(*devices)
    start(f"{args.host}:{args.port}".encode(), cache_dir, args.threads, len(devices), array)
    return 1  # it returns only if it could not start (bind failed, ...)


if __name__ == "__main__":
    sys.exit(main())

"""Where an idle server's resident memory goes, llamaserve against llama-server.

Each server in turn on the same file (the tiny random-weight llama of
tests/make_tiny_model.py by default), with bench/step_overhead.py's settings (64 sequences,
the same context and threads), warmed up with a few streamed requests, then left idle. Its
resident set is read from ``/proc/PID/smaps`` and split by mapping: the model file (mmap),
heap and anonymous memory (what the process allocated: llama.cpp's KV cache and compute
buffers, and in llamaserve every Python object), and shared libraries.

A third row is a bare Python process that only imports what llamaserve imports at startup
(no model, no context): the Python runtime's own share. llamaserve's heap and anonymous
memory above it is what llama.cpp and the serving state take, comparable with
llama-server's. ``--by-package`` adds each top-level package's resident growth while it
was imported (its own modules, not those it imported first).

    python bench/idle_memory.py [--llama-server PATH] [--model PATH] [--by-package]

Writes bench/results/idle_memory.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from make_tiny_model import write_tiny_model  # noqa: E402
from step_overhead import (  # noqa: E402
    N_SEQ,
    rss_mib,
    start_llama_server,
    start_llamaserve,
    warm,
)

from report import report  # noqa: E402

# what llamaserve imports before it serves (server.py's load_model and build_app)
STARTUP_IMPORTS = ("engine.core", "engine.runner", "api.web.app", "api.web.lifecycle",
                   "uvicorn")

_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def smaps(pid: int | str, model: str = "") -> dict[str, float]:
    """Resident MiB of a process by kind of mapping."""
    kinds: collections.Counter[str] = collections.Counter()
    kind = "anonymous"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = _MAPPING.match(line)
        if m:
            name = m.group(1)
            kind = ("model file" if model and name == model else
                    "heap + anonymous" if name in ("", "[heap]") else
                    "stacks" if name.startswith("[stack") else
                    "shared libraries" if ".so" in name else "other")
        elif line.startswith("Rss:"):
            kinds[kind] += int(line.split()[1]) / 1024
    return dict(kinds)


def row(server: str, kinds: dict[str, float], total: float) -> dict[str, Any]:
    return {"server": server, "RSS MiB": round(total, 1),
            **{k: round(kinds.get(k, 0.0), 1) for k in
               ("model file", "heap + anonymous", "shared libraries")},
            "rest": round(total - sum(kinds.get(k, 0.0) for k in
                                      ("model file", "heap + anonymous", "shared libraries")), 1)}


_IMPORTS_ONLY = """
import importlib, json, sys
sys.path.insert(0, {root!r})
for m in {mods!r}:
    importlib.import_module(m)
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))
sys.stdout.flush()
sys.stdin.read()
"""

_BY_PACKAGE = """
import collections, importlib, importlib._bootstrap_external as be, json, sys
sys.path.insert(0, {root!r})
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1048576
own, stack = collections.Counter(), []
def wrap(cls):
    orig = cls.exec_module
    def exec_module(self, module):
        stack.append(0.0)
        t0 = rss()
        try:
            orig(self, module)
        finally:
            total, child = rss() - t0, stack.pop()
            own[module.__name__.split(".")[0]] += total - child
            if stack:
                stack[-1] += total
    cls.exec_module = exec_module
for cls in (be.SourceFileLoader, be.SourcelessFileLoader, be.ExtensionFileLoader):
    wrap(cls)
for m in {mods!r}:
    importlib.import_module(m)
print(json.dumps(own.most_common(20)))
"""


def python_only() -> tuple[dict[str, float], float, int]:
    """A bare interpreter after llamaserve's startup imports: (kinds, RSS, packages)."""
    code = _IMPORTS_ONLY.format(root=str(ROOT), mods=STARTUP_IMPORTS)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdin is not None
    packages = len(json.loads(proc.stdout.readline()))
    kinds, total = smaps(proc.pid), rss_mib(proc.pid)
    proc.stdin.close()
    proc.wait(30)
    return kinds, total, packages


def by_package() -> list[tuple[str, float]]:
    code = _BY_PACKAGE.format(root=str(ROOT), mods=STARTUP_IMPORTS)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return [(name, mib) for name, mib in json.loads(done.stdout)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", default="/tmp/llama-build/bin/llama-server")
    ap.add_argument("--model", default=None, help="default: the tiny model (written if missing)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="as bench/step_overhead.py")
    ap.add_argument("--by-package", action="store_true")
    args = ap.parse_args()
    model = args.model or str(write_tiny_model())
    ctx = N_SEQ * (args.tokens + 64)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("llamaserve", "llama-server"):
            if name == "llama-server":
                proc, port = start_llama_server(args.llama_server, model, args.threads, ctx,
                                                Path(tmp))
            else:
                proc, port = start_llamaserve(model, args.threads, ctx, Path(tmp))
            try:
                warm(proc.pid, port)
                time.sleep(1.0)
                rows.append(row(name, smaps(proc.pid, str(Path(model).resolve())),
                                rss_mib(proc.pid)))
            finally:
                proc.terminate()
                proc.wait(30)
    kinds, total, packages = python_only()
    rows.append(row(f"Python alone, llamaserve's imports ({packages} packages)", kinds, total))
    ours, theirs = rows[0], rows[1]
    rows.append({"server": "llamaserve - llama-server",
                 **{k: round(ours[k] - theirs[k], 1) for k in ours if k != "server"}})
    report(rows, "idle_memory")
    if args.by_package:
        print("\nresident growth while each package was imported (MiB, its own modules):")
        for name, mib in by_package():
            print(f"  {mib:6.2f}  {name}")


if __name__ == "__main__":
    main()

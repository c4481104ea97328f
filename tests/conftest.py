"""Shared fixtures: real models from the cache and real servers in subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fetch_models import model_path  # noqa: E402

# Every server the tests start captures what it sends (api/web/capture.py); at the end of
# the session each body on an OpenAI route is checked against OpenAI's OpenAPI
# description (tests/openapi_check.py) and the session fails on any invalid one.
CAPTURE = Path(tempfile.mkdtemp(prefix="llamaserve-capture-"))
os.environ["LLAMASERVE_CAPTURE_DIR"] = str(CAPTURE)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the server's modules once: with ``PYTHONDONTWRITEBYTECODE`` set (as in CI's
    containers) every test server would otherwise compile ~150 modules from source, ~0.6 s
    of each start (imports take 1.4 s instead of 0.8)."""
    import compileall

    for name in ("api", "engine", "parsers"):
        compileall.compile_dir(ROOT / name, quiet=1)
    compileall.compile_file(ROOT / "server.py", quiet=1)


# per test file: wall seconds (setup + call + teardown, module fixtures included) and the
# machine's busy CPU seconds meanwhile (all cores, from /proc/stat): printed at the end, the
# CI budget's map. A file far below 100% of the cores waits more than it computes.
FILE_SECONDS: dict[str, float] = {}
FILE_CPU: dict[str, float] = {}


def busy_cpu_seconds() -> float:
    try:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:8]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    started, busy = time.monotonic(), busy_cpu_seconds()
    yield
    name = item.nodeid.split("::", 1)[0]
    FILE_SECONDS[name] = FILE_SECONDS.get(name, 0.0) + time.monotonic() - started
    FILE_CPU[name] = FILE_CPU.get(name, 0.0) + busy_cpu_seconds() - busy


def file_times() -> str:
    cores = os.cpu_count() or 1
    total, cpu = sum(FILE_SECONDS.values()), sum(FILE_CPU.values())
    slowest = sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1])[:20]
    return (f"time per file ({total:.0f}s, CPU busy {cpu / max(total * cores, 1e-9):.0%} of "
            f"{cores} cores): " + ", ".join(
                f"{Path(k).name} {v:.0f}s {FILE_CPU[k] / max(v * cores, 1e-9):.0%}"
                for k, v in slowest))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from openapi_check import check_directory
    report = check_directory(CAPTURE)
    shutil.rmtree(CAPTURE, ignore_errors=True)
    summary = report.summary() + ("\n" + file_times() if len(FILE_SECONDS) > 1 else "")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(summary)
    else:
        print(summary)
    if report.invalid and session.exitstatus == 0:
        session.exitstatus = 1


def require_model(name: str) -> str:
    path = model_path(name)
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"model {name} missing: run llamaserve pull")
        pytest.skip(f"model {name} not fetched (llamaserve pull {name})")
    return str(path)


def require_cli(name: str, install: str) -> str:
    """A command on PATH: skipped without it, failed under CI (``.ci/run`` installs it)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing: {install} (see .ci/run)")
        pytest.skip(f"{name} not installed ({install})")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(config: dict[str, Any], tmp: Path, *, wait: bool = True,
                 env: dict[str, str] | None = None,
                 default_batch_dir: bool = False) -> ServerProcess:
    """A server on ``config``. The Batch API's store goes under ``tmp`` unless the config
    names one or ``default_batch_dir`` keeps the default (``~/.cache/llamaserve/batches/
    <port>``): hundreds of test servers would leave hundreds of stores there."""
    port = free_port()
    server_cfg = config.get("server", {})
    if not default_batch_dir and "batch_dir" not in server_cfg \
            and server_cfg.get("batch_api", True):
        config = {**config, "server": {**server_cfg,
                                       "batch_dir": str(tmp / f"batches-{port}")}}
    cfg_path = tmp / f"config-{time.monotonic_ns()}.json"
    cfg_path.write_text(json.dumps(config))
    log_path = tmp / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "server.py"), "-C", str(cfg_path), "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})})
    server = ServerProcess(proc, port, log_path)
    if wait:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                    return server
            time.sleep(0.2)
        server.stop()
        raise RuntimeError(f"server did not become healthy:\n{server.log()}")
    return server


# llama.cpp is not batch-invariant: the same sequence decoded alone or beside others goes
# through different matmul kernels (a vector product for one row, tiled products for
# several), whose sums round differently. Greedy text can then part at a near-tie.
# nats between the reference's chosen token and the other run's; up to ~0.45 seen (Gemma 3
# Q4_K_M, AVX-512 repacked kernels, two prompts beside each other after a cached prefix)
NEAR_TIE = 0.6


def same_greedy_text(text: str, tokens: list[str], tops: list[dict[str, float]],
                     gap: float = NEAR_TIE) -> bool:
    """``text`` (a greedy run beside other sequences) is the reference run's text
    (``tokens``, each position's top alternatives ``tops``, e.g. from ``logprobs``), or
    the two part where the reference's pick led the other run's by at most ``gap``."""
    pos = 0
    for token, top in zip(tokens, tops, strict=True):
        if text.startswith(token, pos):
            pos += len(token)
            continue
        best = top.get(token, max(top.values()))
        return any(other != token and text.startswith(other, pos) and best - lp <= gap
                   for other, lp in top.items())
    return pos == len(text)


def load_config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "configs" / name).read_text())
    return data


def gemma_config(**model: Any) -> dict[str, Any]:
    cfg = load_config("gemma3-270m.json")
    cfg["model"].update({"path": require_model("gemma"), "n_ctx": 4096, "n_seq_max": 16,
                         **model})
    return cfg


def qwen_config(**model: Any) -> dict[str, Any]:
    cfg = load_config("qwen2.5-coder-0.5b.json")
    cfg["model"].update({"path": require_model("qwen-0.5b"), "n_ctx": 4096, "n_seq_max": 4,
                         **model})
    return cfg


def tiny_qwen_config(*, ending: bool = False, **model: Any) -> dict[str, Any]:
    """A 2-block random-weight llama with Qwen2.5-Coder's real tokenizer, tool-calling
    template and response schema (tests/make_tiny_model.py): thousands of prompt tokens a
    second, text that is noise. ``ending``: answers end by themselves after a few tokens;
    otherwise they run to their limit. For protocol tests where only the shape counts."""
    from make_tiny_model import TinySpec, write_tiny_model
    cfg = qwen_config(**model)
    cfg["model"].update(alias="tiny-qwen", path=str(write_tiny_model(
        spec=TinySpec(eos_weight=12.0 if ending else 0.0), tokenizer_from="qwen-0.5b")))
    return cfg


THINKING_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
    "\n</think>\n{% endif %}{{ m.content or '' }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def thinking_qwen_config(**model: Any) -> dict[str, Any]:
    """Qwen with a ChatML template that opens a <think> block in every answer and renders
    earlier reasoning, read by the Qwen3.5 response schema: every answer starts as
    reasoning, deterministically, on a model that does not reason by itself."""
    return qwen_config(chat_template=THINKING_TEMPLATE, response_schema=load_config(
        "qwen3.5-0.8b.json")["model"]["response_schema"], **model)


@pytest.fixture(scope="session")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(gemma_config(), tmp_path_factory.mktemp("gemma"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def qwen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(qwen_config(), tmp_path_factory.mktemp("qwen"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_qwen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The tiny Qwen-tokenizer model, n_ctx 2048, keep-alive beats every 50 ms."""
    cfg = tiny_qwen_config(n_ctx=2048, n_seq_max=2)
    cfg["server"]["keepalive_seconds"] = 0.05
    server = start_server(cfg, tmp_path_factory.mktemp("tiny-qwen"))
    yield server
    server.stop()


# --- client-compatibility suite (tests/test_compat_*.py) -------------------------------------

COMPAT_MODEL = "qwen2.5-coder-0.5b-instruct"


def require_library(module: str) -> Any:
    """Import a client library of the compat suite; a missing one fails under CI, else skips."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        hint = "pip install -e '.[compat]' (in its own venv: see docs/COMPATIBILITY.md)"
        if os.environ.get("CI"):
            pytest.fail(f"{module} missing: {hint}", pytrace=False)
        pytest.skip(f"{module} not installed: {hint}", allow_module_level=True)


@pytest.fixture(scope="session")
def compat_qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One Qwen2.5-Coder-0.5B server for every client library: chat, tools, Responses, and
    embeddings from the generation model's side context (`embedding: true`)."""
    server = start_server(qwen_config(n_ctx=8192, embedding=True),
                          tmp_path_factory.mktemp("compat-qwen"))
    yield server
    server.stop()


def minilm_config(**model: Any) -> dict[str, Any]:
    cfg = load_config("all-minilm-l6-v2.json")
    cfg["model"].update(path=require_model("minilm"), **model)
    return cfg


@pytest.fixture(scope="session")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """all-MiniLM-L6-v2: the embedding tests' and the client libraries' embedding model."""
    server = start_server(minilm_config(), tmp_path_factory.mktemp("minilm"))
    yield server
    server.stop()


def reranker_config(kind: str, **model: Any) -> dict[str, Any]:
    """A random-weight reranker GGUF (tests/make_reranker_models.py; "bert" cross-encoder or
    "qwen3" LLM reranker), written into the test-model cache on first use: its scores are
    noise, for tests of the plumbing."""
    from make_reranker_models import write_reranker
    return {"model": {"alias": f"reranker-{kind}", "path": str(write_reranker(kind)),
                      "n_ctx": 4096, "n_seq_max": 16, "n_batch": 2048, "n_ubatch": 2048,
                      "threads": 2, "threads_batch": 2, **model}}


# --- llama.cpp RPC servers (tests/test_rpc.py, bench/rpc_split.py) ---------------------------


def require_rpc() -> None:
    """The bindings' ggml has the RPC backend; without it CI fails, a dev machine skips."""
    from engine.backends.rpc import not_built_message, supports_rpc

    if not supports_rpc():
        if os.environ.get("CI"):
            pytest.fail(not_built_message(), pytrace=False)
        pytest.skip(not_built_message())


@dataclass
class RpcServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_rpc_server(tmp: Path, threads: int = 1,
                     env: dict[str, str] | None = None) -> RpcServerProcess:
    """An rpc-server on a free loopback port: ``llamaserve rpc-server`` (the bindings'
    ggml_backend_rpc_start_server), or the binary $LLAMASERVE_RPC_SERVER names (llama.cpp's
    own rpc-server, built from the vendored sources); ready once it answers a handshake."""
    from engine.backends.rpc import RpcError, hello

    port = free_port()
    binary = os.environ.get("LLAMASERVE_RPC_SERVER")
    args = [binary] if binary else [sys.executable, str(ROOT / "server.py"), "rpc-server"]
    log_path = tmp / f"rpc-server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*args, "--port", str(port), "--threads", str(threads)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **(env or {})})
    server = RpcServerProcess(proc, port, log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server exited with {proc.returncode}:\n"
                               f"{log_path.read_text(errors='replace')}")
        try:
            hello(server.endpoint, timeout=2)
            return server
        except RpcError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("rpc-server did not start")

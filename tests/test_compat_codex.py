"""OpenAI's Codex CLI (npm `@openai/codex`) driving a real llamaserve on Qwen2.5-Coder-0.5B as a
custom Responses provider, with its default tool set, over SSE and over WebSocket.

Nothing is installed here: `.ci/run` installs Node (Debian) and the CLI (npm); without `codex` on
PATH the tests skip, and fail under CI. Only update checks, analytics, feedback and OpenTelemetry
export are switched off; the tools Codex offers are its defaults (function tools, a `namespace`
of multi-agent tools, `web_search`). The shell sandbox is bypassed
(`--dangerously-bypass-approvals-and-sandbox`): CI runs as root in a container without the
namespaces Codex's Linux sandbox needs.

What is asserted is the protocol, not the wisdom: a turn completes (`turn.completed`, no
`turn.failed`, no stream error or idle timeout; on a random-weight model with Qwen's tokenizer
and template, which prefills Codex's prompt in seconds), and for a prompt that asks for a
shell command (on the real model), a `command_execution` item ran and the follow-up request
carrying its output was answered to the end: `response.completed`, or `response.incomplete`
at the server's `max_output_tokens` (the 0.5B model may loop after a tool result; Codex
reports that as "Incomplete response returned"), never an idle timeout or an HTTP error.

`LLAMASERVE_CODEX_ARGS` adds arguments to `codex exec` when debugging a server, e.g.
`--disable multi_agent -c web_search='"disabled"'` to take the `namespace` and `web_search`
tools out; CI never sets it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    COMPAT_MODEL,
    ServerProcess,
    qwen_config,
    require_cli,
    start_server,
    tiny_qwen_config,
)

TRANSPORTS = ["sse", "websocket"]
TURN_TIMEOUT = 600  # s per codex exec; Codex's own idle timeout (300 s) stays at its default
# the shell prompt: a command the 0.5B model reliably emits through exec_command
# naming the tool: with Codex's full default tool set the 0.5B model otherwise often writes
# the command as text instead of calling a tool (the model's failure, not the protocol's)
SHELL_PROMPT = ('Use the exec_command tool to run this shell command: echo hello-codex '
                '(call exec_command with {"cmd": "echo hello-codex"})')
SHELL_ATTEMPTS = 3  # the model's choice to call the tool shifts with the cache state
# Codex warns (as an `error` item) that it has no metadata for a model it does not know
METADATA_WARNING = "Model metadata for"
# how Codex reports a response that ended `incomplete` (here: at max_output_tokens)
INCOMPLETE = "Incomplete response returned"


def codex_binary() -> str:
    return require_cli("codex", "npm install -g @openai/codex")


@pytest.fixture(scope="module")
def protocol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """For the turn itself (the protocol, both transports): the random-weight model with
    Qwen's tokenizer and template, whose answers end after a few tokens, prefills Codex's
    prompt in seconds (the real model takes ~2 minutes of CI for it)."""
    codex_binary()
    config = tiny_qwen_config(ending=True, n_ctx=16384, n_seq_max=2, max_output_tokens=384)
    config["model"]["alias"] = COMPAT_MODEL
    server = start_server(config, tmp_path_factory.mktemp("codex-tiny"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def codex_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    codex_binary()
    # Codex's first request is ~6k prompt tokens (system prompt + tool schemas)
    # max_output_tokens bounds a looping answer (Codex sends no limit of its own)
    server = start_server(qwen_config(n_ctx=16384, n_seq_max=2, max_output_tokens=384),
                          tmp_path_factory.mktemp("codex-qwen"))
    yield server
    server.stop()


def codex_config(server: ServerProcess, transport: str) -> str:
    return f"""\
model = "{COMPAT_MODEL}"
model_provider = "llamaserve"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
metrics_exporter = "none"
trace_exporter = "none"

[model_providers.llamaserve]
name = "llamaserve"
base_url = "{server.base_url}"
wire_api = "responses"
env_key = "LLAMASERVE_API_KEY"
supports_websockets = {"true" if transport == "websocket" else "false"}
request_max_retries = 0
stream_max_retries = 0
"""


def run_codex(server: ServerProcess, tmp: Path, transport: str, prompt: str, *,
              incomplete_ok: bool = False) -> list[dict[str, Any]]:
    home, work = tmp / "codex-home", tmp / "work"
    home.mkdir(parents=True)
    work.mkdir()
    (home / "config.toml").write_text(codex_config(server, transport))
    env = {**os.environ, "CODEX_HOME": str(home), "LLAMASERVE_API_KEY": "unused",
           "NO_COLOR": "1"}
    started = time.monotonic()
    proc = subprocess.run(
        [codex_binary(), "exec", "--json", "--skip-git-repo-check", "--ephemeral",
         "--dangerously-bypass-approvals-and-sandbox", "-C", str(work),
         *shlex.split(os.environ.get("LLAMASERVE_CODEX_ARGS", "")), prompt],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=TURN_TIMEOUT)
    (tmp / "codex.stdout").write_text(proc.stdout)
    (tmp / "codex.stderr").write_text(proc.stderr)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    elapsed = time.monotonic() - started
    failures = [e for e in events if e["type"] in ("turn.failed", "error")
                and not (incomplete_ok and INCOMPLETE in json.dumps(e))]
    assert not failures, (f"codex {transport} failed after {elapsed:.0f}s: {failures}\n"
                          f"stderr: {proc.stderr[-2000:]}")
    assert proc.returncode == 0 or incomplete_ok, proc.stderr[-2000:]
    return events


def items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["item"] for e in events
            if e["type"] == "item.completed" and e["item"]["type"] == kind]


def finished(server: ServerProcess) -> float:
    m = server.metrics()
    return sum(v for k, v in m.items()
               if k.startswith("llamaserve_sequences_finished_total")
               and ("reason=stop" in k or "reason=length" in k))


def check_turn_ended(events: list[dict[str, Any]], *, incomplete_ok: bool = False) -> None:
    types = [e["type"] for e in events]
    assert types[0] == "thread.started" and "turn.started" in types
    if incomplete_ok and types[-1] == "turn.failed":
        assert INCOMPLETE in events[-1]["error"]["message"], events[-1]
    else:
        assert types[-1] == "turn.completed", types
        usage = events[-1]["usage"]
        assert usage["input_tokens"] > 1000 and usage["output_tokens"] > 0
    errors = [i for i in items(events, "error") if METADATA_WARNING not in i["message"]]
    assert not errors, errors


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_turn_completes(protocol_server: ServerProcess, tmp_path: Path,
                          transport: str) -> None:
    before = finished(protocol_server)
    events = run_codex(protocol_server, tmp_path, transport, "Say hello.")
    check_turn_ended(events)
    assert items(events, "agent_message") or items(events, "command_execution")
    assert finished(protocol_server) > before  # generated by this server, not a cached reply


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_shell_command_round_trips(codex_server: ServerProcess, tmp_path: Path,
                                     transport: str) -> None:
    before = finished(codex_server)
    for attempt in range(SHELL_ATTEMPTS):  # every attempt must end properly (the protocol)
        events = run_codex(codex_server, tmp_path / str(attempt), transport, SHELL_PROMPT,
                           incomplete_ok=True)
        check_turn_ended(events, incomplete_ok=True)
        commands = items(events, "command_execution")
        if commands:
            break
    assert commands, [e for e in events if e["type"] == "item.completed"]
    assert all(c["status"] in ("completed", "failed") for c in commands)
    assert any(c.get("exit_code") is not None for c in commands)  # it really ran
    # the call and at least one follow-up request carrying its output were generated here
    assert finished(codex_server) >= before + 2

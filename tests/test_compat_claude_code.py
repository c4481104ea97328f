"""Anthropic's Claude Code CLI (npm `@anthropic-ai/claude-code`) driving a real llamaserve over
the Anthropic Messages API, in `-p` (print) mode, set up as a new user would: the base URL, a
key, the model's alias, and non-essential traffic off. Nothing else is changed.

Nothing is installed here: `.ci/run` installs Node (Debian) and the CLI (npm, pinned); without
`claude` on PATH the tests skip, and fail under CI.

- Its defaults, on the tiny random-weight model with Qwen2.5-Coder's real tokenizer and
  template (tests/make_tiny_model.py, answers that end after a few tokens): every tool, beta
  and field Claude Code sends, its ~11,500-token first prompt (a mid-conversation system
  turn, deferred tools, `thinking`, `context_management`, `output_config.effort`, `max_tokens`
  32000 beyond the context's room). A turn completes, and a second turn (`--continue`) reads
  the whole earlier prompt from the prefix cache. The tiny model prefills it in seconds; the
  0.5B model takes minutes on 2 cores, which is what the cache is for.

- A `Bash` call on a real model: Qwen2.5-Coder-1.5B-Instruct (`llamaserve pull qwen-1.5b`,
  fetched by `.ci/run`) with `--tools Bash` (Claude Code's own ~2,900-token prompt for that one
  tool; all ~20 tools would take minutes to prefill at 1.5B on 2 cores). The model calls
  Bash, Claude Code runs the command, its output goes back as a `tool_result`, and the
  request that carries it reads the first request's whole prompt from the prefix cache.
  (Qwen2.5-Coder-0.5B writes the call as a markdown code block instead, under any prompt
  tried: too small for Claude Code's instructions.)
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    ServerProcess,
    qwen_config,
    require_cli,
    require_model,
    start_server,
    tiny_qwen_config,
)

CLAUDE_VERSION = os.environ.get("CLAUDE_CODE_VERSION", "2.1.332")  # as .ci/run installs
TURN_TIMEOUT = 600  # s per claude -p


def claude_binary() -> str:
    return require_cli("claude", "npm install -g @anthropic-ai/claude-code")


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    claude_binary()
    server = start_server(tiny_qwen_config(ending=True, n_ctx=32768, n_seq_max=2),
                          tmp_path_factory.mktemp("claude-tiny"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def coder_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    claude_binary()
    config = qwen_config(path=require_model("qwen-1.5b"), alias="qwen-1.5b", n_ctx=8192,
                         n_seq_max=2, max_output_tokens=384,
                         sampling={"temperature": 0})  # Claude Code sends none: greedy
    server = start_server(config, tmp_path_factory.mktemp("claude-coder"))
    yield server
    server.stop()


def run_claude(server: ServerProcess, home: Path, alias: str, prompt: str,
               *args: str) -> list[dict[str, Any]]:
    """One `claude -p` run; its stream-json events (the last one is the `result`)."""
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": server.url,
           "ANTHROPIC_API_KEY": "unused", "ANTHROPIC_MODEL": alias,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "NO_COLOR": "1"}
    proc = subprocess.run(
        # the prompt before the options: `--tools` and `--allowedTools` take every word after
        [claude_binary(), "-p", prompt, "--output-format", "stream-json", "--verbose", *args],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=TURN_TIMEOUT)
    (home / "claude.stdout").write_text(proc.stdout)
    (home / "claude.stderr").write_text(proc.stderr)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert events and events[-1]["type"] == "result", proc.stderr[-2000:]
    return events


def http_errors(server: ServerProcess) -> list[str]:
    return [line for line in server.log().splitlines()
            if '"POST /v1/messages' in line and '" 200 ' not in line]


def test_version_is_pinned() -> None:
    out = subprocess.run([claude_binary(), "--version"], capture_output=True, text=True)
    assert out.stdout.startswith(CLAUDE_VERSION), out.stdout


def test_its_defaults_complete_a_turn_and_the_next_reuses_the_prefix(
        tiny_server: ServerProcess, tmp_path: Path) -> None:
    first = run_claude(tiny_server, tmp_path, "tiny-qwen", "Say hello.")[-1]
    assert not first["is_error"], first
    assert first["stop_reason"] == "end_turn" and first["num_turns"] == 1
    prompt = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
    assert prompt > 8000  # the whole default prompt: system, ~20 tools, reminders
    second = run_claude(tiny_server, tmp_path, "tiny-qwen", "Say it again.", "--continue")[-1]
    assert not second["is_error"], second
    # everything the first turn's prompt held came from the prefix cache
    assert second["usage"]["cache_read_input_tokens"] >= prompt - 16, second["usage"]
    assert second["usage"]["input_tokens"] < 200
    assert not http_errors(tiny_server)


def test_a_bash_call_runs_and_its_result_goes_back_from_the_cache(
        coder_server: ServerProcess, tmp_path: Path) -> None:
    events = run_claude(coder_server, tmp_path, "qwen-1.5b",
                        "Use the Bash tool to run: echo llamaserve-ok",
                        "--tools", "Bash", "--allowedTools", "Bash")
    answers = [e["message"] for e in events if e["type"] == "assistant"]
    calls = [b for m in answers for b in m["content"] if b["type"] == "tool_use"]
    assert calls and calls[0]["name"] == "Bash", answers
    assert "echo llamaserve-ok" in calls[0]["input"]["command"]
    # Claude Code ran it and sent the output back in the next request
    results = [b for e in events if e["type"] == "user" for b in e["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert results and results[0]["tool_use_id"] == calls[0]["id"], events
    assert not results[0]["is_error"] and "llamaserve-ok" in str(results[0]["content"])
    final = events[-1]
    assert not final["is_error"] and final["num_turns"] == 2, final
    # the second request (its prompt = the first's + the call + its result) read the whole
    # first prompt from the prefix cache: Claude Code sums both requests' usage
    first_prompt = answers[0]["usage"]["input_tokens"]
    assert first_prompt > 2000
    assert final["usage"]["cache_read_input_tokens"] >= first_prompt - 16, final["usage"]
    assert final["usage"]["input_tokens"] < first_prompt + 300, final["usage"]
    assert not http_errors(coder_server)

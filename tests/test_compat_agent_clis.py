"""The agent CLIs people install beside Codex and Claude Code, unmodified, on one llamaserve:
opencode, Kilo, Cline, Qwen Code and Continue (npm) and Aider (PyPI), each set up as its docs
tell a user with a local OpenAI-compatible server (tests/agent_clis.py); and the Vercel AI
SDK's OpenAI-compatible provider, the client code opencode, Kilo and Cline run.

Nothing is installed here: `.ci/run` installs each one, pinned; without it the test skips,
and fails under CI. Crush (npm `@charmland/crush`) is missing: its npm package downloads the
binary from github.com at install time, which cannot work offline (docs/COMPATIBILITY.md).

One server holds two models, shared by every test:
- Qwen2.5-Coder-0.5B-Instruct, greedy, takes the tool round trips: opencode's and Cline's
  whole default turns (prompts of ~7,300 and ~5,400 tokens, 10 and 25 tools; ~2 minutes
  each on two CPU cores: the model calls the CLI's read tool, the CLI runs it, the file goes
  back as a `tool` message and the long prompt is read from the prefix cache), Continue's
  (~2,300 tokens, `Read`), the AI SDK's (`streamText` with a tool: the streamed call
  parsed, the tool run, its result sent back), and Aider's (the file is in its prompt).
  What it answers after the tool result is its own: an answer, or (at some prompts) bare
  JSON calls until `max_tokens`, which opencode and Cline report as an output-limit stop;
- the tiny random-weight model with Qwen2.5-Coder's real tokenizer and template
  (tests/make_tiny_model.py; answers that end after a few tokens) takes each CLI's whole
  default turn to its end: opencode's, Cline's, Kilo's and Qwen Code's (~12,000 and
  ~17,500 tokens for the last two), which it prefills in seconds. On the 0.5B model Kilo's
  and Qwen Code's take 3.5 and 8.5 minutes, and the model answers them in text rather than
  calling a tool (measured greedy; bench/agent_cli_turns.py runs them sampled). Kilo is a
  fork of opencode and sends through the same AI SDK provider.

What is judged is the protocol, read from the server's capture (api/web/capture.py, each
request and its answer): the CLI exits 0 and reports its turn done, every request it sent was
answered 200, and the requests are what the CLI sends by default (its tools, streaming).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_clis import (
    AI_SDK_MODULES,
    PACKAGES,
    PROMPT,
    RUNNERS,
    SECRET,
    VERSIONS,
    Exchange,
    Traffic,
    Workspace,
    find_binary,
    stopped_at_output_limit,
    turn_done,
)

from conftest import (
    CAPTURE,
    COMPAT_MODEL,
    ROOT,
    ServerProcess,
    qwen_config,
    require_cli,
    start_server,
    tiny_qwen_config,
)

TINY = "tiny-qwen"
TURN_TIMEOUT = 600  # s per CLI run
MAX_OUTPUT = 128  # the coder model's max_tokens where a CLI sends none



def binary(name: str) -> str:
    return find_binary(name) or require_cli(name, PACKAGES[name])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # 128: room for a call naming a long tmp path; answers after a tool result are cut
    # there. Greedy where a CLI sends no temperature: the 0.5B model's choice to call the
    # tool (rather than write it as text) is then the same every run
    coder = qwen_config(n_ctx=12288, n_seq_max=2, max_output_tokens=MAX_OUTPUT,
                        sampling={"temperature": 0})["model"]
    tiny = tiny_qwen_config(ending=True, n_ctx=32768, n_seq_max=2)["model"]
    s = start_server({"server": {"host": "127.0.0.1", "max_loaded_models": 2},
                      "models": [coder, tiny]}, tmp_path_factory.mktemp("agent-clis"))
    yield s
    s.stop()


def traffic(server: ServerProcess) -> Traffic:
    return Traffic(CAPTURE / f"{server.proc.pid}.jsonl")


def run_turn(name: str, server: ServerProcess, tmp: Path,
             alias: str) -> subprocess.CompletedProcess[str]:
    binary(name)
    return RUNNERS[name](Workspace.make(tmp), server.base_url, alias, TURN_TIMEOUT)


def run_cli(name: str, server: ServerProcess, tmp: Path, alias: str) -> str:
    proc = run_turn(name, server, tmp, alias)
    assert proc.returncode == 0, (proc.stdout[-1500:], proc.stderr[-1500:])
    assert turn_done(name, proc.stdout), proc.stdout[-1500:]
    return proc.stdout


def check_default_turn(seen: Traffic, min_tools: int) -> list[Exchange]:
    """Every request answered 200; the agent's turn is a streamed chat request carrying the
    CLI's own tools."""
    everything = seen.exchanges()
    assert everything and all(e.status == 200 for e in everything), \
        [(e.path, e.status, e.body[:300]) for e in everything if e.status != 200]
    turns = seen.turns()
    assert turns, [c.request for c in seen.chats()]
    assert len(turns[0].request["tools"]) >= min_tools
    assert turns[0].request.get("stream") is True
    return turns


@pytest.mark.parametrize("name", list(VERSIONS))
def test_version_is_pinned(name: str) -> None:
    out = subprocess.run([binary(name), "--version"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HOME": "/tmp"})
    assert VERSIONS[name] in out.stdout + out.stderr


@pytest.mark.parametrize(("name", "min_tools", "min_prompt"), [
    ("opencode", 8, 5000), ("cline", 15, 4000), ("kilo", 8, 9000), ("qwen", 10, 9000)])
def test_each_cli_completes_its_default_turn(server: ServerProcess, tmp_path: Path,
                                              name: str, min_tools: int,
                                              min_prompt: int) -> None:
    seen = traffic(server)
    run_cli(name, server, tmp_path, TINY)
    turns = check_default_turn(seen, min_tools)
    # its whole default prompt: the server counted it, and the answer ended by itself
    assert max(t.usage()["prompt_tokens"] for t in turns) > min_prompt
    assert all(t.usage() for t in turns)  # asked for with stream_options or not


@pytest.mark.parametrize(("name", "min_tools", "min_prompt"), [
    ("opencode", 8, 5000), ("cline", 15, 4000)])
def test_cli_calls_a_tool_on_a_real_model_and_sends_its_result_back(
        server: ServerProcess, tmp_path: Path, name: str, min_tools: int,
        min_prompt: int) -> None:
    """The whole default turn on Qwen2.5-Coder-0.5B: the model reads hello.txt with the
    CLI's own tool (a streamed call), the CLI runs it, and the next request carries the
    file back as a `tool` message with the call's id, its long prompt read from the prefix
    cache.

    What the model answers then is the model's: greedy, the 0.5B model either answers, and
    the CLI reports its turn done, or writes bare JSON calls of every tool until
    `max_tokens`, depending on the prompt's bytes (the date, the workspace's path: a short
    fixed path made it write a wrong one). Both are judged:
    the CLI exits 0 and reports the turn done, or it stops on its own output-limit rule,
    the server's last answer having ended with `finish_reason: "length"` at the limit.
    The completed turn itself is checked on the tiny model (above)."""
    seen = traffic(server)
    proc = run_turn(name, server, tmp_path, COMPAT_MODEL)
    turns = check_default_turn(seen, min_tools)
    first = turns[0]
    assert first.usage()["prompt_tokens"] > min_prompt
    calls = first.tool_calls()
    assert calls, first.body[-1500:]
    assert "hello.txt" in "".join(c["function"].get("arguments") or "" for c in calls)
    followed = [t for t in turns[1:] if "tool" in t.roles]
    assert followed, [t.roles for t in turns]
    tool_message = next(m for m in followed[0].request["messages"] if m["role"] == "tool")
    assert SECRET in json.dumps(tool_message)
    assert tool_message["tool_call_id"] == calls[0]["id"]
    cached = followed[0].usage()["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first.usage()["prompt_tokens"] - 16
    if proc.returncode == 0 and turn_done(name, proc.stdout):
        return
    assert stopped_at_output_limit(name, proc.stdout), (proc.stdout[-1500:],
                                                        proc.stderr[-1500:])
    last = turns[-1]
    assert last.finish_reason() == "length", last.body[-1500:]
    assert last.usage()["completion_tokens"] == MAX_OUTPUT


def test_ai_sdk_streams_a_tool_call_and_takes_its_result(server: ServerProcess) -> None:
    if not (AI_SDK_MODULES / "ai").exists():
        if os.environ.get("CI"):
            pytest.fail(f"the AI SDK is missing from {AI_SDK_MODULES} (see .ci/run)")
        pytest.skip("the AI SDK is not installed (see .ci/run)")
    seen = traffic(server)
    proc = subprocess.run(["node", str(ROOT / "tests" / "ai_sdk_round_trip.cjs"),
                           str(AI_SDK_MODULES), server.base_url, COMPAT_MODEL],
                          capture_output=True, text=True, timeout=TURN_TIMEOUT)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert proc.returncode == 0 and "error" not in result, result
    first, second = result["steps"][:2]
    # the SDK parsed the streamed call, ran the tool, and sent its result back
    assert first["finishReason"] == "tool-calls"
    assert first["toolCalls"][0]["name"] == "read_file"
    assert first["toolCalls"][0]["input"]["path"].endswith("hello.txt")
    assert SECRET in first["toolResults"][0]["output"]
    assert {"tool-input-delta", "tool-call", "tool-result"} <= set(result["parts"])
    assert second["finishReason"] in ("stop", "length")
    # what the server saw: the call streamed by delta, then a `tool` message with its id
    turns = seen.turns()
    assert [t.status for t in turns] == [200, 200] and "tool" in turns[1].roles
    call_id = turns[0].tool_calls()[0]["id"]
    tool_message = next(m for m in turns[1].request["messages"] if m["role"] == "tool")
    assert tool_message["tool_call_id"] == call_id == first["toolCalls"][0]["id"]
    assert second["usage"]["inputTokenDetails"]["cacheReadTokens"] >= \
        first["usage"]["inputTokens"] - 16


def test_continue_runs_a_tool_and_sends_its_result_back(server: ServerProcess,
                                                       tmp_path: Path) -> None:
    seen = traffic(server)
    run_cli("cn", server, tmp_path, COMPAT_MODEL)
    turns = check_default_turn(seen, min_tools=8)
    # the model called Read (streamed tool-call deltas); Continue ran it and the file went
    # back in the next request, as a `tool` message answered 200
    calls = turns[0].tool_calls()
    assert calls and calls[0]["function"]["name"] == "Read", turns[0].body[-1500:]
    followed = [t for t in turns[1:] if "tool" in t.roles]
    assert followed, [t.roles for t in turns]
    tool_message = next(m for m in followed[0].request["messages"] if m["role"] == "tool")
    assert SECRET in json.dumps(tool_message)
    assert tool_message["tool_call_id"] == calls[0]["id"]
    # the request carrying it read the first request's prompt from the prefix cache
    prompt = turns[0].usage()["prompt_tokens"]
    assert followed[0].usage()["prompt_tokens_details"]["cached_tokens"] >= prompt - 16


def test_aider_answers_with_the_file_in_its_prompt(server: ServerProcess,
                                                  tmp_path: Path) -> None:
    seen = traffic(server)
    run_cli("aider", server, tmp_path, COMPAT_MODEL)
    everything = seen.exchanges()
    assert everything and all(e.status == 200 for e in everything)
    chats = seen.chats()
    assert chats and SECRET in json.dumps(chats[0].request["messages"])
    assert chats[0].request.get("stream") is True
    assert chats[0].text().strip()
    assert PROMPT in json.dumps(chats[0].request["messages"])

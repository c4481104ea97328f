"""How each agent CLI is set up and run against a llamaserve, as its docs tell a user with a
local OpenAI-compatible server: a base URL, a key, a model name, and update checks and
telemetry off. Nothing that shapes its requests is changed (tools, system prompt,
`max_tokens`). Shared by tests/test_compat_agent_clis.py (the tiny model) and
bench/agent_cli_turns.py (a real model); the versions are the ones `.ci/run` installs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = {
    "opencode": os.environ.get("OPENCODE_VERSION", "1.18.33"),
    "kilo": os.environ.get("KILO_VERSION", "7.7.7"),
    "cline": os.environ.get("CLINE_VERSION", "3.0.65"),
    "cn": os.environ.get("CONTINUE_CLI_VERSION", "1.5.47"),
    "qwen": os.environ.get("QWEN_CODE_VERSION", "0.24.4"),
    "aider": os.environ.get("AIDER_VERSION", "0.86.2"),
}
PACKAGES = {"opencode": "npm install -g opencode-ai", "kilo": "npm install -g @kilocode/cli",
            "cline": "npm install -g cline", "cn": "npm install -g @continuedev/cli",
            "qwen": "npm install -g @qwen-code/qwen-code",
            "aider": "python -m venv .venv-aider && .venv-aider/bin/pip install aider-chat"}
AI_SDK_MODULES = Path.home() / ".cache" / "llamaserve" / "ai-sdk" / "node_modules"
SECRET = "pelican-42"
PROMPT = "Read the file hello.txt and tell me the secret word."


def find_binary(name: str) -> str | None:
    """The CLI on PATH; Aider from `.venv-aider` (its pins clash with the compat venv's)."""
    local = ROOT / ".venv-aider" / "bin" / name
    if name == "aider" and local.exists():
        return str(local)
    return shutil.which(name)


@dataclass
class Workspace:
    home: Path  # HOME of its own: each CLI keeps config and sessions there
    work: Path  # a git repository holding hello.txt

    @classmethod
    def make(cls, tmp: Path) -> Workspace:
        home, work = tmp / "home", tmp / "work"
        home.mkdir(parents=True)
        work.mkdir()
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        (work / "hello.txt").write_text(f"The secret word is: {SECRET}\n")
        return cls(home, work)

    def run(self, argv: list[str], timeout: float,
            **env: str) -> subprocess.CompletedProcess[str]:
        # PWD too: opencode and Kilo take their project directory from it, not getcwd()
        proc = subprocess.run(argv, cwd=self.work, env={
            **os.environ, "HOME": str(self.home), "PWD": str(self.work), "NO_COLOR": "1",
            **env}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        (self.home.parent / "stdout").write_text(proc.stdout)
        (self.home.parent / "stderr").write_text(proc.stderr)
        return proc


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def ai_sdk_config(base_url: str, alias: str) -> dict[str, Any]:
    """opencode's and Kilo's provider for any OpenAI-compatible server (their docs)."""
    return {"provider": {"llamaserve": {
        "npm": "@ai-sdk/openai-compatible", "name": "llamaserve",
        "options": {"baseURL": base_url, "apiKey": "sk-local"},
        "models": {alias: {"name": alias}}}},
        "model": f"llamaserve/{alias}", "permission": "allow"}


def run_opencode_like(name: str, ws: Workspace, base_url: str, alias: str,
                      timeout: float) -> subprocess.CompletedProcess[str]:
    """opencode or Kilo (a fork of it): `<name>.json` in the project, `run --format json`."""
    (ws.work / f"{name}.json").write_text(json.dumps(ai_sdk_config(base_url, alias)))
    prefix = name.upper()
    return ws.run([find_binary(name) or name, "run", "--format", "json",
                   "-m", f"llamaserve/{alias}", PROMPT], timeout,
                  **{f"{prefix}_DISABLE_MODELS_FETCH": "1", f"{prefix}_DISABLE_AUTOUPDATE": "1",
                     f"{prefix}_DISABLE_LSP_DOWNLOAD": "1", "KILO_TELEMETRY_LEVEL": "off"})


def run_opencode(ws: Workspace, base_url: str, alias: str,
                 timeout: float) -> subprocess.CompletedProcess[str]:
    return run_opencode_like("opencode", ws, base_url, alias, timeout)


def run_kilo(ws: Workspace, base_url: str, alias: str,
             timeout: float) -> subprocess.CompletedProcess[str]:
    return run_opencode_like("kilo", ws, base_url, alias, timeout)


def run_cline(ws: Workspace, base_url: str, alias: str,
              timeout: float) -> subprocess.CompletedProcess[str]:
    """`cline auth` for an OpenAI-compatible provider, then one `--json` task."""
    cline = find_binary("cline") or "cline"
    try:
        auth = ws.run([cline, "auth", "-p", "openai", "-k", "sk-local", "-m", alias,
                       "-b", base_url], timeout)
        if auth.returncode != 0:
            return auth
        return ws.run([cline, "--json", "-P", "openai-compatible", "-m", alias,
                       "-c", str(ws.work), PROMPT], timeout)
    finally:  # Cline leaves a hub daemon behind for its next run
        subprocess.run(["pkill", "-f", f"cline-hub-daemon --cwd {ws.work}"], check=False)


def run_qwen_code(ws: Workspace, base_url: str, alias: str,
                  timeout: float) -> subprocess.CompletedProcess[str]:
    """Qwen Code with `--auth-type openai` and the `OPENAI_*` environment (its docs)."""
    (ws.home / ".qwen").mkdir(exist_ok=True)
    (ws.home / ".qwen" / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
        "model": {"name": alias}, "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}))
    return ws.run([find_binary("qwen") or "qwen", "--auth-type", "openai", "-m", alias,
                   "--approval-mode", "yolo", "--output-format", "json", PROMPT], timeout,
                  OPENAI_API_KEY="sk-local", OPENAI_BASE_URL=base_url, OPENAI_MODEL=alias,
                  QWEN_CODE_SUPPRESS_YOLO_WARNING="1")


def run_continue(ws: Workspace, base_url: str, alias: str,
                 timeout: float) -> subprocess.CompletedProcess[str]:
    """Continue's `cn` headless (`-p`) with a local config.yaml naming the model."""
    (ws.work / "config.yaml").write_text(f"""\
name: llamaserve
version: 1.0.0
schema: v1
models:
  - name: {alias}
    provider: openai
    model: {alias}
    apiBase: {base_url}
    apiKey: sk-local
    roles: [chat, edit, apply]
    capabilities: [tool_use]
""")
    return ws.run([find_binary("cn") or "cn", "--config", "./config.yaml", "--auto",
                   "-p", PROMPT], timeout, CONTINUE_CLI_ENABLE_TELEMETRY="0")


def run_aider(ws: Workspace, base_url: str, alias: str,
              timeout: float) -> subprocess.CompletedProcess[str]:
    """Aider through litellm's OpenAI-compatible provider; the file is `--read` into the
    prompt (Aider edits by text formats, not tool calls)."""
    return ws.run([find_binary("aider") or "aider", "--model", f"openai/{alias}",
                   "--openai-api-base", base_url, "--openai-api-key", "sk-local", "--no-git",
                   "--no-check-update", "--analytics-disable", "--no-show-model-warnings",
                   "--no-pretty", "--yes-always", "--map-tokens", "0", "--read", "hello.txt",
                   "--message", PROMPT], timeout, LITELLM_LOCAL_MODEL_COST_MAP="True")


Runner = Callable[[Workspace, str, str, float], "subprocess.CompletedProcess[str]"]
RUNNERS: dict[str, Runner] = {"opencode": run_opencode, "kilo": run_kilo, "cline": run_cline,
                              "qwen": run_qwen_code, "cn": run_continue, "aider": run_aider}


def stopped_at_output_limit(name: str, stdout: str) -> bool:
    """The CLI's own report that the model's answer ran into its output-token limit."""
    if name in ("opencode", "kilo"):
        finished = [e for e in json_lines(stdout) if e["type"] == "step_finish"]
        return bool(finished) and finished[-1]["part"]["reason"] == "length"
    if name == "cline":
        result = [e for e in json_lines(stdout) if e.get("type") == "run_result"]
        return bool(result) and result[-1]["finishReason"] == "error" \
            and "maximum output token limit" in result[-1].get("text", "")
    return False


def turn_done(name: str, stdout: str) -> bool:
    """The CLI's own report that its turn ended normally."""
    if name in ("opencode", "kilo"):
        events = json_lines(stdout)
        finished = [e for e in events if e["type"] == "step_finish"]
        return bool(finished) and finished[-1]["part"]["reason"] == "stop" \
            and not any(e["type"] == "error" for e in events)
    if name == "cline":
        result = [e for e in json_lines(stdout) if e.get("type") == "run_result"]
        return bool(result) and result[-1]["finishReason"] == "completed"
    if name == "qwen":
        result = [e for e in json.loads(stdout) if e.get("type") == "result"]
        return bool(result) and not result[-1].get("is_error")
    return True  # cn and aider: exit status 0 is their report


# -- what the server saw, from its capture file (api/web/capture.py) ------------------------

@dataclass
class Exchange:
    path: str
    status: int
    request: dict[str, Any]
    body: str

    @property
    def roles(self) -> list[str]:
        return [m.get("role", "") for m in self.request.get("messages", [])]

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(line[5:]) for line in self.body.splitlines()
                if line.startswith("data:") and line[5:].strip() != "[DONE]"]

    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool-call deltas this (streamed) answer sent."""
        return [c for chunk in self.chunks() for choice in chunk.get("choices", [])
                for c in choice.get("delta", {}).get("tool_calls") or []]

    def usage(self) -> dict[str, Any]:
        found = [c["usage"] for c in self.chunks() if c.get("usage")]
        return dict(found[-1]) if found else {}

    def finish_reason(self) -> str | None:
        found = [choice["finish_reason"] for chunk in self.chunks()
                 for choice in chunk.get("choices", []) if choice.get("finish_reason")]
        return found[-1] if found else None

    def text(self) -> str:
        return "".join(choice.get("delta", {}).get("content") or ""
                       for chunk in self.chunks() for choice in chunk.get("choices", []))


class Traffic:
    """What the server answered after this point, from its capture file."""

    def __init__(self, capture_file: Path) -> None:
        self.path = capture_file
        self.start = self._lines()

    def _lines(self) -> int:
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0

    def exchanges(self) -> list[Exchange]:
        out = []
        for line in self.path.read_text().splitlines()[self.start:]:
            record = json.loads(line)
            if record.get("kind") != "http" or not record["path"].startswith("/v1/"):
                continue
            try:
                request = json.loads(record.get("request") or "{}")
            except ValueError:
                request = {}
            out.append(Exchange(record["path"], record["status"], request, record["body"]))
        return out

    def chats(self) -> list[Exchange]:
        return [e for e in self.exchanges() if e.path == "/v1/chat/completions"]

    def turns(self) -> list[Exchange]:
        """The agent's requests: chat requests that carry tools."""
        return [c for c in self.chats() if c.request.get("tools")]

    def round_trip(self) -> bool:
        """A tool call answered, then a later request carried a `tool` message."""
        turns = self.turns()
        return any(t.tool_calls() for t in turns) and any("tool" in t.roles for t in turns)

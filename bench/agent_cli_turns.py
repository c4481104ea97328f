"""Each agent CLI's default turn on a real model: opencode, Kilo, Cline, Qwen Code, Continue
and Aider (tests/agent_clis.py sets each up as its docs say, unmodified), one after another
on one llamaserve, "Read the file hello.txt and tell me the secret word." in a fresh git
repository. The compatibility suite runs these CLIs on the tiny random-weight model (their
5,000-17,000-token prompts would take minutes each on two CPU cores); this is where their
tool round trips on a real model are measured.

Per CLI, from the server's capture (api/web/capture.py): the requests it sent and how many
were not answered 200, the first turn's prompt tokens and tools, the tool calls the model
made, whether a later request carried a `tool` message back (the round trip), the prompt
tokens evaluated (not read from the prefix cache), wall time, and the CLI's own verdict.

    flock /tmp/llamaserve-bench.lock python bench/agent_cli_turns.py [--model qwen-0.5b] \
        [--cli opencode --cli cline ...]

Prints the table and writes bench/results/agent_cli_turns.json. The model's wisdom (whether it
calls the tool, or loops after its result) is the model's: what is judged is the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from agent_clis import (  # noqa: E402
    RUNNERS,
    VERSIONS,
    Traffic,
    Workspace,
    find_binary,
    turn_done,
)

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import report  # noqa: E402

ALIASES = {"qwen-0.5b": "qwen2.5-coder-0.5b-instruct", "qwen-1.5b": "qwen-1.5b"}


def start(model: str, alias: str, tmp: Path, capture: Path) -> tuple[Any, str]:
    port = _port()
    config = json.loads((ROOT / "configs" / "qwen2.5-coder-0.5b.json").read_text())
    config["server"] = {"host": "127.0.0.1", "port": port, "log_level": "info"}
    config["model"].update(path=str(model_path(model)), alias=alias, n_ctx=32768,
                           n_seq_max=2, max_output_tokens=256)
    path = tmp / "config.json"
    path.write_text(json.dumps(config))
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "LLAMASERVE_CAPTURE_DIR": str(capture)})
    _wait(f"http://127.0.0.1:{port}/healthz", proc)
    return proc, f"http://127.0.0.1:{port}/v1"


def one(name: str, base_url: str, alias: str, tmp: Path, capture_file: Path,
        timeout: float) -> dict[str, Any]:
    seen = Traffic(capture_file)
    ws = Workspace.make(tmp / name)
    started = time.monotonic()
    try:
        proc = RUNNERS[name](ws, base_url, alias, timeout)
        code, done = proc.returncode, turn_done(name, proc.stdout)
    except subprocess.TimeoutExpired:
        code, done = -1, False
    seconds = time.monotonic() - started
    exchanges, turns = seen.exchanges(), seen.turns()
    usages = [t.usage() for t in seen.chats()]
    evaluated = sum(u.get("prompt_tokens", 0)
                    - (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    for u in usages)
    return {"cli": name, "version": VERSIONS[name], "requests": len(exchanges),
            "not 200": sum(e.status != 200 for e in exchanges),
            "tools": len(turns[0].request["tools"]) if turns else 0,
            "first prompt": turns[0].usage().get("prompt_tokens", 0) if turns else
            (usages[0].get("prompt_tokens", 0) if usages else 0),
            "tool calls": sum(len(t.tool_calls()) for t in turns),
            "round trip": seen.round_trip(),
            "evaluated": evaluated, "seconds": round(seconds, 1), "exit": code,
            "turn done": done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-0.5b", choices=list(ALIASES))
    parser.add_argument("--cli", action="append", choices=list(RUNNERS),
                        help="run only these (default: every one installed)")
    parser.add_argument("--timeout", type=float, default=1200, help="s per CLI run")
    args = parser.parse_args()
    names = args.cli or [n for n in RUNNERS if find_binary(n)]
    alias = ALIASES[args.model]
    with tempfile.TemporaryDirectory(prefix="agent-clis-") as tmp_name:
        tmp = Path(tmp_name)
        capture = tmp / "capture"
        proc, base_url = start(args.model, alias, tmp, capture)
        try:
            rows = []
            for name in names:
                row = one(name, base_url, alias, tmp, capture / f"{proc.pid}.jsonl",
                          args.timeout)
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            proc.terminate()
            proc.wait(30)
    report(rows, "agent_cli_turns")


if __name__ == "__main__":
    main()

"""What a tool grammar costs per request, before and after the grammar bounds.

For Claude Code's 24 tools (tests/fixtures/claude_code_tools.json) and for the same list
without its one large bound (``Workflow``'s ``maxLength: 524288``), in one run:

- **before**: the code at ``--ref`` (default: the commit before the bounds), run from a
  git worktree in a subprocess: the Hermes tool-call grammar converted, then parsed by
  llama.cpp in-process (that code parsed it twice per request: a check on the prepare
  pool, then the sampler on the engine thread); a crash is reported as such;
- **after**: this checkout: conversion with the bounds, then the check in the grammar
  checker process (a first grammar: the round trip and the parse; a repeated one: the
  cache), and llama.cpp's parse in-process that the engine does when it builds the sampler.

    python bench/grammar_build.py [--ref REV] [--repeats 20]

Prints a table (milliseconds, the median of ``--repeats``) and writes
``bench/results/grammar_build.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from report import report  # noqa: E402

TOOLS = ROOT / "tests" / "fixtures" / "claude_code_tools.json"
BEFORE_BOUNDS = "7a1b379"  # main before engine/constraints/json_schema.py relaxed large counts

# Runs inside the worktree of --ref: converts and parses in-process, prints JSON timings.
MEASURE = r"""
import json, statistics, sys, time
sys.path.insert(0, ".")
import llama_cpp as L
from engine.constraints.grammar import tool_call_grammar
keep = L.llama_log_callback(lambda *a: None)
L.llama_log_set(keep, None)
L.llama_backend_init()
mp = L.llama_model_default_params(); mp.vocab_only = True
vocab = L.llama_model_get_vocab(L.llama_model_load_from_file(sys.argv[1].encode(), mp))
tools = json.loads(sys.argv[2]); repeats = int(sys.argv[3])
build, parse = [], []
for _ in range(repeats):
    t0 = time.perf_counter()
    g = tool_call_grammar(tools, "<tool_call>", "</tool_call>", parallel=True, lazy=False)
    t1 = time.perf_counter()
    sampler = L.llama_sampler_init_grammar(vocab, g.text.encode(), b"root")
    t2 = time.perf_counter()
    assert sampler
    L.llama_sampler_free(sampler)
    build.append(t1 - t0); parse.append(t2 - t1)
print(json.dumps({"build": statistics.median(build), "parse": statistics.median(parse),
                  "bytes": len(g.text)}))
"""


def openai_tools(anthropic_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
            for t in anthropic_tools]


def without_large_bound(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = json.loads(json.dumps(tools))
    for tool in out:
        for prop in tool["function"]["parameters"].get("properties", {}).values():
            for sub in (prop, prop.get("additionalProperties")):
                if isinstance(sub, dict) and sub.get("maxLength", 0) > 1000:
                    del sub["maxLength"]
    return out


def before(ref: str, model: str, tools: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
                       check=True, capture_output=True)
        try:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", MEASURE, model, json.dumps(tools),
                                   str(repeats)], cwd=tree, capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                return {"crash": f"exit {done.returncode} after "
                                 f"{time.perf_counter() - started:.1f} s"}
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)


def after(model: str, tools: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    import llama_cpp as L

    from engine.constraints.grammar import tool_call_grammar
    from engine.sampling.grammar_check import GrammarChecker

    keep = L.llama_log_callback(lambda *a: None)
    L.llama_log_set(keep, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    vocab = L.llama_model_get_vocab(L.llama_model_load_from_file(model.encode(), mp))
    checker = GrammarChecker(model)
    checker.check('root ::= "warm"')  # the child's start is not a per-request cost
    build, first, cached, parse = [], [], [], []
    try:
        for i in range(repeats):
            t0 = time.perf_counter()
            g = tool_call_grammar(tools, "<tool_call>", "</tool_call>", parallel=True,
                                  lazy=False)
            t1 = time.perf_counter()
            text = f"{g.text}\n# {i}\n"  # a grammar the checker has not seen
            checker.check(text)
            t2 = time.perf_counter()
            checker.check(text)
            t3 = time.perf_counter()
            sampler = L.llama_sampler_init_grammar(vocab, g.text.encode(), b"root")
            t4 = time.perf_counter()
            assert sampler
            L.llama_sampler_free(sampler)
            build.append(t1 - t0)
            first.append(t2 - t1)
            cached.append(t3 - t2)
            parse.append(t4 - t3)
    finally:
        checker.close()
    return {"build": statistics.median(build), "check": statistics.median(first),
            "check cached": statistics.median(cached), "parse": statistics.median(parse),
            "bytes": len(g.text), "relaxed": len(g.relaxed)}


def ms(value: Any) -> Any:
    return round(value * 1000, 2) if isinstance(value, float) else value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default=BEFORE_BOUNDS)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--model", default=None, help="a GGUF for the vocabulary (Qwen 0.5B)")
    args = ap.parse_args()
    from fetch_models import model_path

    model = args.model or str(model_path("qwen-0.5b"))
    all_tools = openai_tools(json.loads(TOOLS.read_text()))
    rows = []
    for name, tools in (("24 tools (maxLength 524288)", all_tools),
                        ("24 tools, large bound removed", without_large_bound(all_tools))):
        old = before(args.ref, model, tools, args.repeats)
        new = after(model, tools, args.repeats)
        per_request_old = old["build"] + 2 * old["parse"] if "build" in old else None
        rows.append({
            "tools": name,
            "before build ms": ms(old.get("build", old.get("crash"))),
            "before parse ms": ms(old.get("parse", "")),
            "before bytes": old.get("bytes", ""),
            "after build ms": ms(new["build"]),
            "after check ms (new grammar)": ms(new["check"]),
            "after check ms (cached)": ms(new["check cached"]),
            "after engine parse ms": ms(new["parse"]),
            "after bytes": new["bytes"],
            "relaxed bounds": new["relaxed"],
            "after / before, new grammar": round(
                (new["build"] + new["check"] + new["parse"]) / per_request_old, 2)
            if per_request_old else "",
            "after / before, cached": round(
                (new["build"] + new["check cached"] + new["parse"]) / per_request_old, 2)
            if per_request_old else "",
        })
    report(rows, "grammar_build")


if __name__ == "__main__":
    main()

"""MaskBench: the constraint engine alone on real-world schemas and their test instances,
against the published results of llguidance, XGrammar, llama.cpp and Outlines.

MaskBench (guidance-ai/jsonschemabench, ``maskbench/data``: 11,306 schemas from
JSONSchemaBench's datasets plus BFCL, JSON-mode-eval, MCP and hand-written ones) gives most
schemas valid and invalid instances, checked with Python's and Rust's ``jsonschema``. An
engine passes a schema when it compiles it, allows every valid instance and refuses every
invalid one. Its README publishes each engine's count of passing schemas, compile errors,
"validation errors" (a valid instance refused) and "invalidation errors" (an invalid
instance allowed: the engine would let a model write it).

Here each schema is compiled as the server compiles a ``response_format`` schema
(``engine.constraints.grammar.json_grammar``, ``--modes strict,loose``: ``strict`` refuses
what it cannot enforce, not strict relaxes it and records the relaxation), parsed by
llama.cpp's grammar sampler (the engine's authority), and each instance
(``json.dumps(data, ensure_ascii=False)``, as MaskBench writes it) run through that sampler
token by token (``tests/grammar_walk.py``'s ``TextChecker``; any tokenization does, the
grammar reads each token's text), the end included: stricter than MaskBench's runner,
which does not ask whether the grammar may end there. Under ``strict`` an invalidation
error is a broken guarantee: it must be 0. Not strict, each one's schema must have recorded
a relaxation (counted apart otherwise).

Schemas run in a worker process (``--worker``), one JSON line each; a worker that dies or
passes ``--timeout`` on a schema is replaced and that schema counted as a crash or a
timeout. Per dataset (the file name's prefix): schemas, passing, refused, validation errors,
invalidation errors, crashes and timeouts, compile ms (to GBNF plus llama.cpp's parse: p50,
p99, max).

    python bench/maskbench.py --data /path/to/maskbench/data [--modes strict,loose]
        [--per-dataset N] [--dataset Github_hard ...]

Writes bench/results/maskbench.json (and prints the table).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from report import report  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/llamaserve/test-models/tiny-llama-qwen-0.5b.gguf"
MAX_CRASHES_IN_A_ROW = 20  # then the worker itself is broken (a model it cannot load)


def dataset_of(name: str) -> str:
    """``Github_easy---o13947.json`` -> ``Github_easy``; ``BFCL_java_3.json`` -> ``BFCL_java``."""
    if "---" in name:
        return name.split("---", 1)[0]
    stem = name.removesuffix(".json")
    head, _, tail = stem.rpartition("_")
    return head if tail.isdigit() else stem


def one_schema(checker: Any, path: Path, strict: bool) -> dict[str, Any]:
    """Compile one MaskBench file's schema and run its instances (in the worker)."""
    from engine.constraints.grammar import GrammarError, json_grammar

    data = json.loads(path.read_text())
    out: dict[str, Any] = {"file": path.name, "tests": len(data.get("tests", []))}
    t0 = time.perf_counter()
    try:
        grammar = json_grammar(data["schema"], strict=strict)
    except GrammarError as exc:
        return {**out, "status": "refused", "why": str(exc)[:300]}
    except Exception as exc:  # a converter bug: counted apart
        return {**out, "status": "converter error", "why": repr(exc)[:300]}
    sampler = checker.sampler(grammar.text)
    out["compile_ms"] = 1e3 * (time.perf_counter() - t0)
    if sampler is None:
        return {**out, "status": "llama.cpp refused"}
    out["relaxed"] = list(grammar.relaxed)
    wrong: list[str] = []
    try:
        for i, test in enumerate(data.get("tests", [])):
            checker.L.llama_sampler_reset(sampler)
            text = json.dumps(test["data"], indent=None, ensure_ascii=False)
            allowed = checker.allows(sampler, text)
            if allowed != test["valid"]:
                wrong.append(f"test {i}: " + ("valid, refused" if test["valid"]
                                              else "invalid, allowed"))
    finally:
        checker.free(sampler)
    out["refused_valid"] = sum("refused" in w for w in wrong)
    out["allowed_invalid"] = sum("allowed" in w for w in wrong)
    out["status"] = "passing" if not wrong else "wrong"
    out["wrong"] = wrong[:4]
    return out


def worker(mode: str, model: str) -> None:
    """Read file paths from stdin, answer one JSON line each."""
    import llama_cpp
    from grammar_walk import TextChecker

    quiet = llama_cpp.llama_log_callback(lambda *a: None)  # (kept: llama.cpp calls it)
    llama_cpp.llama_log_set(quiet, None)
    checker = TextChecker(model)
    for line in sys.stdin:
        result = one_schema(checker, Path(line.strip()), mode == "strict")
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


class Worker:
    """One worker process at a time; its stderr (llama.cpp's log, a crash's traceback)
    goes to ``log``."""

    def __init__(self, mode: str, model: str, log: Path) -> None:
        self.args = [sys.executable, __file__, "--worker", mode, "--model", model]
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.crashes_in_a_row = 0

    def ask(self, path: Path, timeout: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            with self.log.open("a") as err:
                self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line: str | None = None
        try:
            self.proc.stdin.write(f"{path}\n")
            self.proc.stdin.flush()
            line = _read_line(self.proc.stdout, timeout)
            answer = dict(json.loads(line)) if line else None
        except (BrokenPipeError, json.JSONDecodeError):  # died, or wrote something else
            answer = None
        if answer is not None:
            self.crashes_in_a_row = 0
            return answer
        status = "timeout" if line is None and self.proc.poll() is None else "crash"
        self.close()
        self.crashes_in_a_row += 1
        if self.crashes_in_a_row >= MAX_CRASHES_IN_A_ROW:
            raise SystemExit(f"{MAX_CRASHES_IN_A_ROW} schemas in a row crashed the worker: "
                             f"see {self.log}")
        return {"file": path.name, "status": status}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _read_line(stream: IO[str], timeout: float) -> str | None:
    """A line, "" at the end of the stream (the worker died), None after ``timeout``."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else None


def summarise(mode: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by[dataset_of(r["file"])].append(r)
    rows = []
    for name, items in [*sorted(by.items()), ("all", results)]:
        status = defaultdict(int)
        for r in items:
            status[r["status"]] += 1
        ms = sorted(r["compile_ms"] for r in items if "compile_ms" in r)
        invalid = [r for r in items if r.get("allowed_invalid")]
        rows.append({
            "mode": mode, "dataset": name, "schemas": len(items),
            "passing": status["passing"],
            "refused": status["refused"] + status["llama.cpp refused"],
            "valid refused": sum(1 for r in items if r.get("refused_valid")),
            "invalid allowed": len(invalid),
            "of which unrecorded": sum(1 for r in invalid if not r.get("relaxed")),
            "converter errors": status["converter error"],
            "crash / timeout": status["crash"] + status["timeout"],
            "compile ms p50": round(statistics.median(ms), 2) if ms else "",
            "p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else "",
            "max": round(ms[-1], 1) if ms else ""})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="MaskBench's maskbench/data folder")
    ap.add_argument("--modes", default="strict,loose")
    ap.add_argument("--dataset", action="append", default=[], help="only these datasets")
    ap.add_argument("--per-dataset", type=int, default=0, help="every k-th file, this many "
                    "a dataset (0: all)")
    ap.add_argument("--timeout", type=float, default=120.0, help="s per schema")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="a GGUF whose vocabulary "
                    "tokenizes the instances (tests/make_tiny_model.py's Qwen-tokenizer one)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.model)
        return
    if args.data is None:
        ap.error("--data is required")
    if not Path(args.model).is_file():
        ap.error(f"--model {args.model}: no such file (tests/make_tiny_model.py writes it)")
    files: dict[str, list[Path]] = defaultdict(list)
    for f in sorted(args.data.glob("*.json")):
        files[dataset_of(f.name)].append(f)
    chosen: list[Path] = []
    for name, group in sorted(files.items()):
        if args.dataset and name not in args.dataset:
            continue
        if args.per_dataset:
            step = max(len(group) // args.per_dataset, 1)
            group = group[::step][:args.per_dataset]
        chosen += group
    rows: list[dict[str, Any]] = []
    details: dict[str, list[dict[str, Any]]] = {}
    out = Path(os.environ.get("BENCH_OUT", ROOT / "bench" / "results"))
    out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):
        w = Worker(mode, args.model, out / "maskbench_worker.log")
        started = time.monotonic()
        results = []
        try:
            for i, f in enumerate(chosen):
                results.append(w.ask(f, args.timeout))
                if (i + 1) % 500 == 0:
                    print(f"{mode}: {i + 1} of {len(chosen)} "
                          f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        finally:
            w.close()
        details[mode] = results
        rows += summarise(mode, results)
    (out / "maskbench_schemas.json").write_text(json.dumps(details, indent=1))
    report(rows, "maskbench")


if __name__ == "__main__":
    main()

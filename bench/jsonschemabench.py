"""Real-world JSON Schemas (JSONSchemaBench) through the constraint engine and through servers.

The corpus is guidance-ai/jsonschemabench's ``data/`` (about 10,000 schemas in ten
datasets: GitHub trivial to ultra, Glaive function calls, JSON Schema Store, Kubernetes,
Snowplow, Washington Post); it is not shipped here: pass its folder with ``--corpus``. A
stratified sample (``--per-dataset`` schemas of each dataset, every k-th file in name
order) runs in one or more modes side by side:

- ``engine``: the schema compiled by ``engine.constraints.grammar.json_grammar`` (strict
  and not) and
  walked through llama.cpp's grammar sampler with random logits (``tests/grammar_walk.py``,
  a random model without a model), ``--seeds`` walks per schema;
- ``URL`` (one per ``--server``): ``/v1/chat/completions`` with ``response_format``
  ``json_schema`` (``--strict`` sets its ``strict``), a real model behind it, temperature
  0.7, ``--max-tokens``.

Per dataset: valid answers, refused schemas (a 400 or a grammar error), cut off (the
length limit or the walk's), and broken (ended normally, breaks the schema: must be 0),
plus compile time per schema (p50, p99, max; through a server, what the schema adds to a
one-token answer whose prompt is cached; ``--compile-only`` measures that alone, generating no
answers, and ``--dataset`` keeps only the datasets named). Prints a table, writes JSON
(``--out``).

    python bench/jsonschemabench.py --corpus ~/jsonschemabench/data --per-dataset 6 \\
        --mode engine --server http://127.0.0.1:8000 --server http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from api.chat.answer_check import schema_errors  # noqa: E402
from engine.constraints.grammar import GrammarError, json_grammar  # noqa: E402


def sample(corpus: Path, per_dataset: int) -> dict[str, list[tuple[str, Any]]]:
    out: dict[str, list[tuple[str, Any]]] = {}
    for folder in sorted(p for p in corpus.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.json"))
        step = max(len(files) // per_dataset, 1)
        picked = []
        for f in files[::step][:per_dataset]:
            data = json.loads(f.read_text())
            schema = data.get("json_schema", data) if isinstance(data, dict) else data
            picked.append((f.name, schema))
        out[folder.name] = picked
    return out


def run_engine(schemas: dict[str, list[tuple[str, Any]]], strict: bool, seeds: int,
               model: str) -> dict[str, Any]:
    from grammar_walk import GrammarWalker

    walker = GrammarWalker(model)
    result: dict[str, Any] = {}
    for dataset, items in schemas.items():
        counts = defaultdict(int)
        times = []
        for name, schema in items:
            t0 = time.perf_counter()
            try:
                grammar = json_grammar(schema, strict=strict)
            except GrammarError as exc:
                counts["refused"] += 1
                counts.setdefault("why", [])  # type: ignore[arg-type]
                counts["why"].append(f"{name}: {str(exc)[:160]}")  # type: ignore[attr-defined]
                continue
            finally:
                times.append(time.perf_counter() - t0)
            for seed in range(seeds):
                text = walker.walk(grammar.text, np.random.default_rng(seed), max_steps=400)
                if text is None:
                    counts["cut_off"] += 1
                    continue
                why = schema_errors(json.loads(text), schema)
                counts["valid" if why is None else "broken"] += 1
                if why is not None:
                    counts.setdefault("broken_why", [])  # type: ignore[arg-type]
                    counts["broken_why"].append(f"{name}: {why}")  # type: ignore[attr-defined]
        result[dataset] = {**counts, "compile_ms": _quantiles(times)}
    walker.close()
    return result


def run_server(url: str, schemas: dict[str, list[tuple[str, Any]]], strict: bool,
               max_tokens: int, compile_only: bool = False) -> dict[str, Any]:
    """Each schema through a server. Its compile time is what the schema adds to a
    one-token answer: the same request timed without ``response_format`` (which also
    puts the prompt in the server's prefix cache), then with it; the same for any server.
    ``compile_only``: that time alone (a refusal still counts), no answer generated."""
    result: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=600) as http:
        for dataset, items in schemas.items():
            counts: dict[str, Any] = defaultdict(int)
            times: list[float] = []
            for name, schema in items:
                body = {"model": "m", "max_tokens": max_tokens, "temperature": 0.7, "seed": 1,
                        "messages": [{"role": "user", "content":
                                      "Write one JSON value that follows this schema:\n"
                                      + json.dumps(schema)[:6000]}]}
                constrained = {**body, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "out", "strict": strict, "schema": schema}}}
                free = _timed(http, {**body, "max_tokens": 1})
                _timed(http, {**body, "max_tokens": 1})  # (the prompt cached: the baseline)
                free = min(free, _timed(http, {**body, "max_tokens": 1}))
                first = _timed(http, {**constrained, "max_tokens": 1})
                r = http.post("/v1/chat/completions",
                              json={**constrained, "max_tokens": 1} if compile_only
                              else constrained)
                if r.status_code != 200:
                    counts["refused"] += 1
                    counts.setdefault("why", []).append(f"{name}: {r.text[:160]}")
                    continue
                times.append(max(0.0, first - free))
                if compile_only:
                    continue
                choice = r.json()["choices"][0]
                if choice["finish_reason"] == "length":
                    counts["cut_off"] += 1
                    continue
                try:
                    value = json.loads(choice["message"]["content"] or "")
                except ValueError:
                    counts["broken"] += 1
                    text = choice["message"]["content"] or ""
                    counts.setdefault("broken_why", []).append(
                        f"{name}: not JSON ({choice['finish_reason']}, {len(text)} chars, "
                        f"ends {text[-80:]!r})")
                    counts.setdefault("broken_text", []).append(text)
                    continue
                why = schema_errors(value, schema)
                counts["valid" if why is None else "broken"] += 1
                if why is not None:
                    counts.setdefault("broken_why", []).append(f"{name}: {why}")
            result[dataset] = {**counts, "compile_ms": _quantiles(times)}
    return result


def _timed(http: httpx.Client, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    http.post("/v1/chat/completions", json=body)
    return time.perf_counter() - t0


def _quantiles(times: list[float]) -> dict[str, float]:
    if not times:
        return {}
    ms = sorted(t * 1000 for t in times)
    return {"p50": round(statistics.median(ms), 2),
            "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max": round(ms[-1], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="jsonschemabench's data/")
    ap.add_argument("--per-dataset", type=int, default=6)
    ap.add_argument("--dataset", action="append", default=[],
                    help="only these datasets (default: all ten)")
    ap.add_argument("--compile-only", action="store_true",
                    help="servers: time each schema's compile, generate no answers")
    ap.add_argument("--mode", action="append", default=[], choices=["engine"])
    ap.add_argument("--server", action="append", default=[])
    ap.add_argument("--strict", action="store_true", help="strict schemas for servers")
    ap.add_argument("--seeds", type=int, default=3, help="walks per schema (engine)")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--model", default=str(Path.home() / ".cache/llamaserve/"
                                           "qwen2.5-coder-0.5b-instruct.gguf"),
                    help="the vocabulary the engine's walks draw from")
    ap.add_argument("--out", type=Path, default=Path("jsonschemabench.json"))
    args = ap.parse_args()
    schemas = sample(args.corpus, args.per_dataset)
    if args.dataset:
        schemas = {k: v for k, v in schemas.items() if k in args.dataset}
    runs: dict[str, Any] = {}
    if "engine" in args.mode:
        for strict in (True, False):
            runs[f"engine strict={strict}"] = run_engine(schemas, strict, args.seeds,
                                                         args.model)
    for url in args.server:
        runs[f"{url} strict={args.strict}"] = run_server(url, schemas, args.strict,
                                                         args.max_tokens, args.compile_only)
    args.out.write_text(json.dumps(runs, indent=1))
    cols = ("valid", "refused", "cut_off", "broken")
    for run, per in runs.items():
        print(f"\n## {run}\n")
        print("| dataset | schemas | " + " | ".join(cols) + " | compile ms p50 / p99 / max |")
        print("|---|---|" + "---|" * (len(cols) + 1))
        total = defaultdict(int)
        for dataset, c in per.items():
            for k in cols:
                total[k] += c.get(k, 0)
            q = c.get("compile_ms") or {}
            qs = f"{q.get('p50', '')} / {q.get('p99', '')} / {q.get('max', '')}" if q else ""
            print(f"| {dataset} | {len(schemas[dataset])} | "
                  + " | ".join(str(c.get(k, 0)) for k in cols) + f" | {qs} |")
        print("| all | " + str(sum(len(v) for v in schemas.values())) + " | "
              + " | ".join(str(total[k]) for k in cols) + " | |")


if __name__ == "__main__":
    main()

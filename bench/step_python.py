"""The engine's own Python cost per step, with llama.cpp's arithmetic taken out.

In-process: the engine on the tiny random-weight llama (tests/make_tiny_model.py, SmolLM2's
49k-token tokenizer), ``llama_decode`` made free once a step's shape has been decoded for
real (its logits stay in the buffer, so sampling reads real rows), and C sequences of
``--tokens`` tokens each, not streamed, with llama-server's default sampling (top_k 40,
top_p 0.95, min_p 0.05, temperature 0.8). What is left per token is the engine thread's
Python: scheduling, the batch's arrays, sampling on the logits, detokenizing, stop checks,
metrics and the hand-off. That is the figure a GPU makes the throughput, and it does not
move with what else runs on the machine the way wall-clock tokens/s do: each
configuration runs ``--runs`` times in its own process, alternating, and the table gives
the median and the lowest.

    python bench/step_python.py [--concurrency 1,4,16,64] [--tokens 512] [--runs 3]
        [--against /path/to/another/checkout]    # the same harness on another tree: A/B
        [--variant NAME:key=value,...]           # this tree with model config options

With ``backend_sampling`` on (``--variant backend:backend_sampling=true``), llama.cpp
samples inside the decode the harness makes free: the figure is then the Python left when
a GPU does the sampling, and llama.cpp's own cost of it is not in it (bench/step_overhead.py
measures the whole on this machine).

``--constraints free,json_schema,"tool call"`` runs each configuration under each of
bench/structured.py's constraints (its schema as a strict ``response_format``, its tool as a
forced call): the constrained token's Python, with the decode free as above. On the random
model a JSON string never ends, so this is mostly the step inside a string: the grammar
checked on the best candidates, the matcher's bookkeeping and the forced-token question.
The free decode replays one shape's logits, so a grammar's walk here is not a model's: use
it to profile that step, not for ratios (bench/structured.py measures those).

Writes bench/results/step_python.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from report import report  # noqa: E402


def child(root: str, concurrency: int, tokens: int, rounds: int) -> None:
    """One measurement in this process, on the tree at ``root``; prints a JSON line."""
    sys.path[:0] = [root, root + "/tests"]
    from make_tiny_model import write_tiny_model

    import engine.runner as runner_module
    from engine.config import parse
    from engine.core import Engine
    from engine.request import Request, SamplingParams
    from engine.runner import Runner

    n_seq = max(64, concurrency)
    options = json.loads(os.environ.get("STEP_PYTHON_MODEL", "{}"))
    cfg = parse({"model": {"path": str(write_tiny_model()), "n_ctx": n_seq * (tokens + 64),
                           "n_seq_max": n_seq, "threads": 2, "threads_batch": 2, **options}})
    runner = Runner(cfg.model.path, cfg.model)
    engine = Engine(runner, cfg.model)
    real = runner_module.L.llama_decode
    last: list[int | None] = [None]

    def decode(ctx: object, batch: object) -> int:
        """Free when the previous decode had this shape (every position sampled)."""
        n = batch.n_tokens  # type: ignore[attr-defined]
        pure = all(batch.logits[i] for i in range(n))  # type: ignore[attr-defined]
        previous, last[0] = last[0], (n if pure else None)
        return int(real(ctx, batch)) if not pure or previous != n else 0

    runner_module.L.llama_decode = decode
    finished = [0]
    lock = threading.Lock()

    def publish(batch: list[tuple[object, object]]) -> None:
        with lock:
            finished[0] += sum(d.finish_reason is not None for _, d in batch)  # type: ignore[attr-defined]

    engine.start(publish)
    tid = next(t.native_id for t in threading.enumerate() if t.name == "llamaserve-engine")

    def cpu() -> float:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    prompt = runner.vocabulary.tokenize("Once upon a time, in a land far away,", True, False) \
        if hasattr(runner, "vocabulary") else [1, 2, 3]
    params = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                            ignore_eos=True, max_tokens=tokens, seed=1,
                            grammar=_grammar(os.environ.get("STEP_PYTHON_CONSTRAINT", "free")))
    if params.grammar:
        runner.check_grammar(params)

    def run(n: int, length: int, tag: int) -> None:
        target = finished[0] + n
        for i in range(n):
            r = Request(prompt=[*prompt, 10 + i, 20 + tag], params=params,
                        max_new_tokens=length, whole=True)
            engine.submit(r)
        while finished[0] < target:
            time.sleep(0.001)

    run(1, 8, 0)  # warm-up
    cpu0, wall0 = cpu(), time.perf_counter()
    for k in range(rounds):
        run(concurrency, tokens, k + 1)
    spent, wall = cpu() - cpu0, time.perf_counter() - wall0
    n_tokens = concurrency * tokens * rounds
    print(json.dumps({"cpu_us": 1e6 * spent / n_tokens, "wall_us": 1e6 * wall / n_tokens}))
    engine.stop()
    os._exit(0)


def _grammar(constraint: str) -> str | None:
    """bench/structured.py's constraint of that name, as the engine gets it."""
    if constraint == "free":
        return None
    from structured import SCHEMA, TOOL

    from engine.constraints.grammar import json_grammar, tool_call_grammar

    if constraint == "json_schema":
        return json_grammar(SCHEMA, strict=True).text
    return tool_call_grammar([TOOL], "<tool_call>", "</tool_call>", parallel=False,
                             lazy=False).text


def measure(root: str, concurrency: int, tokens: int, options: dict[str, object],
            constraint: str = "free") -> dict[str, float]:
    rounds = max(1, 8192 // (concurrency * tokens))
    done = subprocess.run([sys.executable, __file__, "--child", root, str(concurrency),
                           str(tokens), str(rounds)], capture_output=True, text=True,
                          check=True, timeout=600,
                          env={**os.environ, "STEP_PYTHON_MODEL": json.dumps(options),
                               "STEP_PYTHON_CONSTRAINT": constraint})
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--against", default=None, help="another checkout, measured alternately")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:key=value,... this tree with these model options (JSON values)")
    ap.add_argument("--constraints", default="free",
                    help='free,json_schema,"tool call": bench/structured.py\'s constraints')
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        root, c, tokens, rounds = args.child
        child(root, int(c), int(tokens), int(rounds))
        return
    trees: dict[str, tuple[str, dict[str, object]]] = {"this tree": (str(ROOT), {})}
    if args.against:
        trees = {"against": (str(Path(args.against).resolve()), {}), **trees}
    for spec in args.variant:
        name, _, pairs = spec.partition(":")
        trees[name] = (str(ROOT), {k: json.loads(v) for k, _, v in
                                   (p.partition("=") for p in pairs.split(",") if p)})
    rows: list[dict[str, object]] = []
    constraints = args.constraints.split(",")
    for c in [int(x) for x in args.concurrency.split(",")]:
        got: dict[tuple[str, str], list[float]] = {
            (name, k): [] for k in constraints for name in trees}
        for _ in range(args.runs):
            for name, k in got:
                root, options = trees[name]
                got[name, k].append(measure(root, c, args.tokens, options, k)["cpu_us"])
        for (name, k), values in got.items():
            rows.append({"tree": name, "constraint": k, "sequences": c,
                         "engine CPU us/token (median)": round(statistics.median(values), 1),
                         "lowest": round(min(values), 1), "runs": len(values)})
            print(rows[-1], file=sys.stderr, flush=True)
    report(rows, "step_python")


if __name__ == "__main__":
    main()

"""Replay prompt lookup on known greedy answers, without running the model: where drafts
lose on scattered-change edits.

Each no-draft answer of bench/edits.py (``bench/results/edits_texts.json``) is the
sequence the model emits; the replay runs the engine's drafter (``PromptLookup``,
``Acceptance``, ``allocate``) step by step against it — a drafted token is accepted while
it equals the answer — and charges each step the relative cost of a decode of its size
(``--costs``: a JSON table {size: seconds}, e.g. from ``--measure``; without it the
default model). Prints per answer: steps, accepted/drafted, proposals by kind with
their first-token acceptance, the draft lengths chosen, and the modelled speed-up.

    python bench/edits_replay.py [--k-max 64] [--costs costs.json]
    flock /tmp/llamaserve-bench.lock python bench/edits_replay.py --measure costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from edit_corpus import EDITS, first_of_each_kind, messages  # noqa: E402
from engine.drafts.policy import (  # noqa: E402
    ALIGN,
    GROWN_MAX,
    DraftLimit,
    DraftState,
    PromptLookup,
    StepCost,
    accepted_count,
    allocate,
    default_cost,
)
from fetch_models import model_path  # noqa: E402

FLOOR = 16
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chatml(msgs: list[dict[str, str]]) -> str:
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n{body}<|im_start|>assistant\n"


def replay(prompt: list[int], answer: list[int], k_max: int, max_ngram: int,
           cost: Callable[[int], float]) -> dict[str, object]:
    """Sizing as the engine does it: ``allocate`` over a ``StepCost`` learned from the
    steps taken so far (``default_cost`` until it is ready); each step costs ``cost``."""
    learned = StepCost()
    lookup = PromptLookup(max_ngram)
    s = DraftState(limit=DraftLimit(k_max, GROWN_MAX, floor=min(k_max, ALIGN)))
    pos, seconds, steps = 1, cost(len(prompt)) * 0, 0  # the first token comes from prefill
    drafted = accepted = 0
    kinds: Counter[str] = Counter()
    kind_hits: Counter[str] = Counter()
    lengths: Counter[int] = Counter()
    while pos < len(answer):
        out = answer[:pos]
        assert s.limit is not None
        room = max(0, min(s.limit.limit, len(answer) - pos - 1))
        s.proposal = lookup.propose(prompt, out, s, room)
        chances = s.acceptance.chances(s.proposal.kind, len(s.proposal.tokens))
        k = allocate([chances], 1, 511, learned if learned.ready else default_cost)[0]
        draft = s.proposal.tokens[:k]
        n = accepted_count(draft, answer[pos:])
        emitted = answer[pos:pos + n + 1]
        if k:
            kinds[s.proposal.kind] += 1
            kind_hits[s.proposal.kind] += n > 0
            lengths[k] += 1
        drafted, accepted = drafted + k, accepted + n
        s.verified(draft, emitted)
        seconds += cost(1 + k)
        learned.observe(1 + k, cost(1 + k))
        steps += 1
        pos += len(emitted)
    plain = cost(1) * (len(answer) - 1)
    return {"tokens": len(answer), "steps": steps, "accepted": f"{accepted}/{drafted}",
            "speedup": round(plain / seconds, 2),
            "first hit by kind": {kd: f"{kind_hits[kd]}/{c}" for kd, c in kinds.items()},
            "lengths": dict(sorted(lengths.items()))}


def table_cost(path: str) -> Callable[[int], float]:
    table = {int(k): float(v) for k, v in json.loads(Path(path).read_text()).items()}
    sizes = sorted(table)

    def cost(n: int) -> float:
        if n in table:
            return table[n]
        lo = max((s for s in sizes if s < n), default=sizes[0])
        hi = min((s for s in sizes if s > n), default=sizes[-1])
        if lo == hi:
            return table[lo] * n / lo
        return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    return cost


def measure(path: str) -> None:
    """Seconds per decode step by size, on a ~700-token context (takes ~30 s)."""
    import time

    from llama_cpp import Llama

    llm = Llama(str(model_path("qwen-0.5b")), n_ctx=4096, n_batch=512, n_threads=2,
                n_threads_batch=2, logits_all=True, verbose=False)
    prefix = llm.tokenize(chatml(messages(EDITS[0])).encode(), special=True)
    llm.eval(prefix)
    out = {}
    for n in [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]:
        best = float("inf")
        for _ in range(3):
            llm.n_tokens = len(prefix)
            llm._ctx.kv_cache_seq_rm(-1, len(prefix), -1)
            t = time.perf_counter()
            llm.eval(prefix[:n])
            best = min(best, time.perf_counter() - t)
        out[n] = round(best, 5)
        print(n, out[n], file=sys.stderr)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", default=str(ROOT / "bench" / "results" / "edits_texts.json"))
    ap.add_argument("--k-max", type=int, default=64)
    ap.add_argument("--max-ngram", type=int, default=6)
    ap.add_argument("--costs", help="JSON {size: seconds} (default: the engine's prior)")
    ap.add_argument("--measure", metavar="PATH", help="time decode steps, write PATH, exit")
    args = ap.parse_args()
    if args.measure:
        measure(args.measure)
        return
    from llama_cpp import Llama

    vocab = Llama(str(model_path("qwen-0.5b")), vocab_only=True, verbose=False)
    cost = table_cost(args.costs) if args.costs else default_cost
    texts = json.loads(Path(args.texts).read_text())
    edits = {"8 edits": EDITS, **{e.kind: [e] for e in first_of_each_kind()}}
    total_plain = total = 0.0
    for kind, answers in texts.items():
        if kind not in edits or kind == "all":
            continue
        for edit, text in zip(edits[kind], answers, strict=False):
            prompt = vocab.tokenize(chatml(messages(edit)).encode(), special=True)
            answer = vocab.tokenize(text.encode(), add_bos=False, special=False)
            r = replay(prompt, answer, args.k_max, args.max_ngram, cost)
            total_plain += len(answer) / float(r["speedup"])  # type: ignore[arg-type]
            total += len(answer)
            print(f"{kind:9} {edit.kind:9} {json.dumps(r)}")
    print(f"overall modelled speed-up {total / max(total_plain, 1e-9):.2f}")


if __name__ == "__main__":
    main()

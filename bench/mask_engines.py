"""Which token-mask engine for constrained decoding (issue 45): the time to decide the
allowed tokens of one step over the whole vocabulary, llama.cpp's grammar sampler (what the
engine runs today, when the best candidates alone do not decide) against llguidance
(``pip install llguidance``; not a dependency), on the same grammars and the same tokens.

For each grammar a random walk is drawn with llguidance's masks (a uniformly random allowed
token each step, end of text once allowed and after ``--steps``), then the same tokens are
replayed through llama.cpp's grammar sampler applied to every candidate, timing each
step's mask (apply) and its advance (accept). Grammars: bench/structured.py's json_schema
answer and forced Hermes tool call as this server writes them in GBNF (llguidance reads
them through its GBNF-to-Lark converter), and the same schema through llguidance's own
JSON Schema compiler. The tokenizer is Qwen2.5's (151,936 tokens) from the tiny model;
control tokens are matched by their text in both engines, as llama.cpp's GBNF does.

    python bench/mask_engines.py [--steps 200] [--walks 3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

import llama_cpp as L  # noqa: E402
from structured import SCHEMA, TOOL  # noqa: E402

from engine.constraints.grammar import json_grammar, tool_call_grammar  # noqa: E402
from engine.sampling.masks import MaskEngine  # noqa: E402
from fetch_models import cache_dir  # noqa: E402
from report import report  # noqa: E402

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def load_vocab(path: str) -> Any:
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), params)
    assert model, path
    return L.llama_model_get_vocab(model)


def ll_walk(tok: Any, spec: str, n_vocab: int, steps: int, rng: random.Random
            ) -> tuple[list[int], list[float], float]:
    """(tokens, mask seconds per step, compile seconds) of a random walk under llguidance."""
    import llguidance
    import llguidance.numpy as lln

    t = time.perf_counter()
    m = llguidance.LLMatcher(tok, spec, log_level=0)
    compile_s = time.perf_counter() - t
    if m.is_error():
        raise ValueError(m.get_error())
    mask = np.zeros((1, (n_vocab + 31) // 32), np.int32)
    out, times = [], []
    for i in range(steps):
        t = time.perf_counter()
        lln.fill_next_token_bitmask(m, mask)
        times.append(time.perf_counter() - t)
        bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")[:n_vocab]
        allowed = np.flatnonzero(bits)
        if m.is_stopped() or not len(allowed):
            break
        eos = tok.eos_token
        token = eos if eos in allowed and i > steps // 2 else int(rng.choice(list(allowed)))
        if token == eos:
            break
        assert m.consume_token(token), m.get_error()
        out.append(token)
    return out, times, compile_s


def cpp_replay(vocab: Any, grammar: str, tokens: list[int]) -> tuple[list[float], list[float],
                                                                      int]:
    """(apply seconds, accept seconds, steps replayed) of llama.cpp's grammar sampler over
    the whole vocabulary along ``tokens``."""
    n = L.llama_vocab_n_tokens(vocab)
    sampler = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp could not parse the grammar"
    rows = np.zeros(n, dtype=TOKEN_DATA)
    ids = np.arange(n, dtype=np.int32)
    apply_s, accept_s = [], []
    try:
        for token in tokens:
            rows["id"], rows["logit"], rows["p"] = ids, 0.0, 0.0
            arr = L.llama_token_data_array(rows.ctypes.data_as(L.llama_token_data_p), n, -1,
                                           False)
            t = time.perf_counter()
            L.llama_sampler_apply(sampler, ctypes.byref(arr))
            apply_s.append(time.perf_counter() - t)
            if not np.isfinite(rows["logit"][token]):
                break  # the two engines read the grammar differently here
            t = time.perf_counter()
            L.llama_sampler_accept(sampler, token)
            accept_s.append(time.perf_counter() - t)
    finally:
        L.llama_sampler_free(sampler)
    return apply_s, accept_s, len(accept_s)


def us(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    return round(1e6 * float(np.percentile(xs, q)), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(cache_dir() / "test-models" /
                                           "tiny-llama-qwen-0.5b.gguf"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--walks", type=int, default=3)
    ap.add_argument("--no-slices", action="store_true",
                    help="llguidance's tokenizer without its slicer (less memory)")
    args = ap.parse_args()
    import llguidance
    from llguidance import LLTokenizer
    from llguidance.gbnf_to_lark import any_to_lark

    L.llama_backend_init()
    vocab = load_vocab(args.model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    t = time.perf_counter()
    slices = [] if args.no_slices else LLTokenizer.general_slices()
    tok = MaskEngine(vocab, n_vocab, slices=slices).tokenizer()  # the engine's own
    print(f"llguidance tokenizer: {time.perf_counter() - t:.2f} s (once per model)",
          file=sys.stderr)
    json_gbnf = json_grammar(SCHEMA).text
    tool_gbnf = tool_call_grammar([TOOL], "<tool_call>", "</tool_call>", parallel=False,
                                  lazy=False).text
    cases = [
        ("json_schema (GBNF)", json_gbnf, llguidance.LLMatcher.grammar_from_lark(
            any_to_lark(json_gbnf))),
        ("json_schema (llguidance JSON)", None, llguidance.LLMatcher.
         grammar_from_json_schema(json.dumps(SCHEMA))),
        ("tool call (GBNF)", tool_gbnf, llguidance.LLMatcher.grammar_from_lark(
            any_to_lark(tool_gbnf))),
    ]
    rows: list[dict[str, object]] = []
    cases_: list[tuple[str, str | None, str]] = cases
    for name, gbnf, spec in cases_:
        ll_t: list[float] = []
        cpp_apply: list[float] = []
        cpp_accept: list[float] = []
        compiles: list[float] = []
        walked = replayed = 0
        for w in range(args.walks):
            tokens, times, compile_s = ll_walk(tok, spec, n_vocab, args.steps,
                                               random.Random(w))
            ll_t += times
            compiles.append(compile_s)
            # (llguidance's own JSON writes spacing this server's GBNF does not take)
            apply_s, accept_s, n = cpp_replay(vocab, gbnf, tokens) if gbnf else ([], [], 0)
            cpp_apply += apply_s
            cpp_accept += accept_s
            walked += len(tokens)
            replayed += n
        cpp_step = [a + b for a, b in zip(cpp_apply, cpp_accept, strict=False)]
        rows.append({
            "grammar": name, "steps": walked, "replayed by llama.cpp": replayed,
            "llguidance mask us p50": us(ll_t, 50), "p90": us(ll_t, 90),
            "max": us(ll_t, 100),
            "llama.cpp all-candidates us p50": us(cpp_step, 50), "p90 ": us(cpp_step, 90),
            "ratio p50": round(statistics.median(cpp_step) / statistics.median(ll_t), 1)
            if cpp_step and ll_t else "",
            "llguidance compile ms": round(1000 * statistics.median(compiles), 2),
        })
    report(rows, "mask_engines")


if __name__ == "__main__":
    main()

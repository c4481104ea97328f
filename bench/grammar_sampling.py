"""Where a constrained step's time goes: the sampler chain alone, in-process on the real model.

Generates ``--tokens`` tokens for bench/structured.py's prompt with each sampler (no grammar;
the json_schema grammar; the forced tool-call grammar), once with the grammar checked on
every candidate (llama.cpp's grammar sampler first in the chain, the old path), once on the
best candidates first (``engine.sampling.grammar_plan``), and once with llguidance's mask
where the best candidates do not decide (``engine.sampling.masks``), and reports decode and
sampling milliseconds per token, how many steps needed the full check or the mask, and
whether each path gave the old path's tokens (same seed).

    python bench/grammar_sampling.py
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from structured import PROMPT, SCHEMA, TOOL  # noqa: E402

from engine.config import ModelConfig  # noqa: E402
from engine.constraints.grammar import json_grammar, tool_call_grammar  # noqa: E402
from engine.request import SamplingParams  # noqa: E402
from engine.runner import Runner  # noqa: E402
from engine.sampling.grammar_step import GrammarChain  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import report  # noqa: E402

# (name, best candidates first, llguidance's mask where they do not decide)
PATHS = (("all candidates", False, False), ("best first", True, False),
         ("best first, then mask", True, True))


def generate(runner: Runner, prompt: list[int], params: SamplingParams, n: int
             ) -> tuple[list[int], float, float, GrammarChain | None]:
    """(tokens, decode seconds, sampling seconds, the grammar chain) for n tokens on seq 0."""
    runner.seq_clear(0)
    sampler = runner.new_sampler(params, prompt)
    decode = sample = 0.0
    out: list[int] = []
    try:
        t = time.perf_counter()
        status, last = runner.decode_tokens([(0, prompt, 0)])
        decode += time.perf_counter() - t
        assert status == 0
        for _ in range(n):
            t = time.perf_counter()
            token = runner.sample(sampler, last[0])
            sample += time.perf_counter() - t
            out.append(token)
            t = time.perf_counter()
            status, last = runner.decode_tokens([(0, [token], len(prompt) + len(out) - 1)])
            decode += time.perf_counter() - t
            assert status == 0
        return out, decode, sample, sampler if isinstance(sampler, GrammarChain) else None
    finally:
        runner.free_sampler(sampler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    path = args.model
    runner = Runner(path, ModelConfig(path=path, n_ctx=1024, n_seq_max=1, threads=2,
                                      threads_batch=2))
    prompt = runner.vocabulary.tokenize(
        f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n",
        add_special=False, parse_special=True)
    grammars = {
        "free": None,
        "json_schema": json_grammar(SCHEMA).text,
        "tool call": tool_call_grammar([TOOL], "<tool_call>", "</tool_call>",
                                       parallel=False, lazy=False).text,
    }
    settings = {"default": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                                          seed=7),
                "greedy": SamplingParams(temperature=0.0)}
    rows: list[dict[str, object]] = []
    masks = runner.samplers.masks
    assert masks is not None and masks.tokenizer(), "llguidance's tokenizer was not built"
    try:
        for sname, base in settings.items():
            for mode, grammar in grammars.items():
                params = replace(base, grammar=grammar)
                results = {}
                for path_name, fast, masked in PATHS:
                    if grammar is None and fast:
                        continue
                    runner.samplers.grammar_fast = fast
                    runner.samplers.masks = masks if masked else None
                    tokens, dec, smp, chain = generate(runner, prompt, params, args.tokens)
                    results[path_name] = tokens
                    rows.append({
                        "sampling": sname, "mode": mode,
                        "grammar check": path_name if grammar else "-",
                        "decode ms/tok": round(1000 * dec / (args.tokens + 1), 2),
                        "sample ms/tok": round(1000 * smp / args.tokens, 2),
                        "full checks": f"{chain.full}/{args.tokens}" if chain and fast else "",
                        "masked": f"{chain.masked}/{args.tokens}" if chain and masked else "",
                        "same tokens": "",
                    })
                    if len(results) > 1:
                        rows[-1]["same tokens"] = tokens == results["all candidates"]
                if len(results) > 1:
                    text = runner.vocabulary.detokenize(results["best first"])
                    print(text[:160], file=sys.stderr)
    finally:
        runner.close()
    report(rows, "grammar_sampling")


if __name__ == "__main__":
    main()

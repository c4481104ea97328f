"""Sampling on the real model (Qwen2.5-Coder-0.5B, in-process runner). Without a grammar,
the shortcuts (greedy as numpy's argmax, a top_k chain given only the logits near the
highest) pick exactly the tokens llama.cpp's chain picks from the whole vocabulary. With
one, checking the best candidates first gives the same tokens as checking every candidate
(greedy and seeded sampling), and sampled answers at temperature 1 always match the
schema."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from conftest import require_model
from engine.config import ModelConfig
from engine.constraints.grammar import json_grammar, tool_call_grammar
from engine.request import SamplingParams
from engine.runner import Runner
from engine.sampling.grammar_step import GrammarChain
from engine.sampling.masks import MaskEngine
from engine.sampling.samplers import Chain

SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"enum": ["open", "closed", "audit"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "tags": {"type": "array", "maxItems": 2,
                         "items": {"enum": ["new", "sale", "heavy"]}},
                "count": {"type": "integer"},
                "details": {"type": "object",
                            "properties": {"in_stock": {"type": "boolean"}},
                            "required": ["in_stock"]}},
            "required": ["name", "tags", "count", "details"]}},
    },
    "required": ["status", "items"],
}
TOOL = {"type": "function", "function": {"name": "save", "parameters": SCHEMA}}
PROMPT = ("<|im_start|>user\nList a few items of a hardware shop as JSON with a status."
          "<|im_end|>\n<|im_start|>assistant\n")
DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    path = require_model("qwen-0.5b")
    r = Runner(path, ModelConfig(path=path, n_ctx=1024, n_seq_max=1, threads=2,
                                 threads_batch=2))
    assert r.samplers.masks is not None
    MASKS[id(r)] = r.samplers.masks  # generate() takes it off unless a test passes it
    try:
        yield r
    finally:
        r.samplers.masks = MASKS.pop(id(r))  # (close waits for its tokenizer build)
        r.close()


@pytest.fixture(scope="module")
def masks(runner: Runner) -> MaskEngine:
    engine = MASKS[id(runner)]
    assert engine.tokenizer() is not None, "llguidance's tokenizer was not built"
    return engine


MASKS: dict[int, MaskEngine] = {}  # each runner's mask engine (taken off by default)
LAST: dict[str, Any] = {}  # the last generate()'s sampler


def generate(runner: Runner, params: SamplingParams, n: int, fast: bool = True,
             prompt_text: str = PROMPT, masks: MaskEngine | None = None,
             forced: Sequence[int] = ()) -> tuple[list[int], int]:
    """Up to n tokens (stops at end of generation) after the ``forced`` ones (accepted as
    if sampled, not returned); and how many steps checked every candidate (a grammar) or
    sampled from the whole vocabulary (no grammar). Without ``masks`` a grammar's steps
    are decided by llama.cpp's grammar alone."""
    runner.samplers.masks = masks
    runner.samplers.grammar_fast = runner.samplers.shortcuts = fast
    prompt = runner.vocabulary.tokenize(prompt_text, add_special=False, parse_special=True)
    runner.seq_clear(0)
    sampler = runner.new_sampler(params, prompt)
    out: list[int] = []
    try:
        for token in forced:
            runner.accept(sampler, token)
        prompt = [*prompt, *forced]
        status, last = runner.decode_tokens([(0, prompt, 0)])
        assert status == 0
        while len(out) < n:
            token = runner.sample(sampler, last[0])
            if runner.vocabulary.is_eog(token):
                break
            out.append(token)
            status, last = runner.decode_tokens([(0, [token], len(prompt) + len(out) - 1)])
            assert status == 0
        LAST["sampler"] = sampler
        return out, sampler.full
    finally:
        runner.free_sampler(sampler)
        runner.samplers.grammar_fast = runner.samplers.shortcuts = True


STORY = ("<|im_start|>user\nTell me a short story about a lighthouse keeper.<|im_end|>\n"
         "<|im_start|>assistant\n")
NO_GRAMMAR = {
    "greedy": SamplingParams(temperature=0.0),
    "defaults": DEFAULTS,
    "hot, wide top_k": replace(DEFAULTS, temperature=1.5, top_k=200, top_p=1.0, min_p=0.0),
    "top_k 1": replace(DEFAULTS, top_k=1),
    "top_k 3, top_p 0.5": replace(DEFAULTS, top_k=3, top_p=0.5, min_p=0.0),
    "min_p only": replace(DEFAULTS, top_k=0, top_p=1.0, min_p=0.2),
    "penalties": replace(DEFAULTS, penalty_last_n=32, repeat_penalty=1.2,
                         presence_penalty=-0.5),
    "logit bias, greedy": SamplingParams(temperature=0.0, logit_bias=((90, 3.0),)),
}


@pytest.mark.parametrize("name", NO_GRAMMAR)
def test_shortcuts_sample_what_the_whole_vocabulary_gives(runner: Runner, name: str) -> None:
    for seed in (7, 8) if name == "defaults" else (7,):
        params = replace(NO_GRAMMAR[name], seed=seed)
        quick, full = generate(runner, params, 32, prompt_text=STORY)
        assert quick == generate(runner, params, 32, fast=False, prompt_text=STORY)[0]
        pointwise = bool(params.logit_bias) or params.penalized
        if not pointwise and (params.greedy or params.top_k):
            assert full <= len(quick) // 8 + 1, f"{name}: {full} samples of the whole vocabulary"
        else:  # bias and penalties change logits first: the whole vocabulary every time
            assert full == len(quick) + (len(quick) < 32)


def test_a_chain_knows_which_shortcut_it_may_take(runner: Runner) -> None:
    made = {name: runner.new_sampler(p, [1, 2, 3]) for name, p in NO_GRAMMAR.items()}
    try:
        kinds = {name: (c.argmax, c.top_k) for name, c in made.items()
                 if isinstance(c, Chain)}
        assert kinds == {"greedy": (True, 0), "defaults": (False, 40),
                         "hot, wide top_k": (False, 200), "top_k 1": (False, 1),
                         "top_k 3, top_p 0.5": (False, 3), "min_p only": (False, 0),
                         "penalties": (False, 0), "logit bias, greedy": (False, 0)}
    finally:
        for c in made.values():
            runner.free_sampler(c)


GRAMMARS = {"json_schema": json_grammar(SCHEMA).text,
            "tool call": tool_call_grammar([TOOL], "<tool_call>", "</tool_call>",
                                           parallel=False, lazy=False).text}


@pytest.mark.parametrize("mode", GRAMMARS)
def test_greedy_is_the_same_as_checking_every_candidate(runner: Runner, mode: str) -> None:
    params = SamplingParams(temperature=0.0, grammar=GRAMMARS[mode])
    fast, full_checks = generate(runner, params, 48)
    assert fast == generate(runner, params, 48, fast=False)[0]
    assert full_checks < len(fast) // 4  # the fast path is what runs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeded_sampling_is_the_same_as_checking_every_candidate(runner: Runner,
                                                                 seed: int) -> None:
    for params in (replace(DEFAULTS, seed=seed, grammar=GRAMMARS["json_schema"]),
                   replace(DEFAULTS, seed=seed, temperature=1.0, top_k=0, top_p=1.0,
                           min_p=0.1, penalty_last_n=16, repeat_penalty=1.3,
                           logit_bias=((90, 2.0),), grammar=GRAMMARS["json_schema"])):
        tokens, _ = generate(runner, params, 32)
        assert tokens == generate(runner, params, 32, fast=False)[0]


def test_sampled_answers_always_match_the_schema(runner: Runner) -> None:
    for seed in range(4):
        params = replace(DEFAULTS, temperature=1.0, seed=100 + seed,
                         grammar=GRAMMARS["json_schema"])
        tokens, _ = generate(runner, params, 400)
        jsonschema.validate(json.loads(runner.vocabulary.detokenize(tokens)), SCHEMA)
    # pure temperature sampling always takes the full path, and also matches
    params = SamplingParams(temperature=1.0, seed=5, grammar=GRAMMARS["json_schema"])
    tokens, full = generate(runner, params, 400)
    jsonschema.validate(json.loads(runner.vocabulary.detokenize(tokens)), SCHEMA)
    assert full == len(tokens) + 1  # every step, the end-of-generation one included


def test_masks_decide_where_the_best_candidates_do_not(runner: Runner,
                                                       masks: MaskEngine) -> None:
    """Pure temperature sampling never lets the best candidates decide: with llguidance's
    masks no step checks every candidate with llama.cpp's grammar, every step is decided
    by the mask (llama.cpp's grammar confirming each token), and every answer validates."""
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=40 + seed,
                                grammar=GRAMMARS["json_schema"])
        tokens, full = generate(runner, params, 400, masks=masks)
        chain = LAST["sampler"]
        assert isinstance(chain, GrammarChain)
        assert full == 0 and chain.masked == len(tokens) + 1 and not chain.unmasked
        jsonschema.validate(json.loads(runner.vocabulary.detokenize(tokens)), SCHEMA)


@pytest.mark.parametrize("mode", GRAMMARS)
def test_greedy_with_masks_writes_valid_answers(runner: Runner, masks: MaskEngine,
                                                mode: str) -> None:
    """The mask writes a string the grammar forces in its canonical tokens, so greedy text
    may differ from llama.cpp's alone where the mask decided; it is valid either way."""
    params = SamplingParams(temperature=0.0, grammar=GRAMMARS[mode])
    tokens, full = generate(runner, params, 400, masks=masks)
    text = runner.vocabulary.detokenize(tokens)
    if mode == "tool call":
        text = text.strip().removeprefix("<tool_call>").removesuffix("</tool_call>")
        jsonschema.validate(json.loads(text)["arguments"], SCHEMA)
    else:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert full == 0


def test_a_lazy_grammar_is_masked_once_its_trigger_fires(runner: Runner,
                                                           masks: MaskEngine) -> None:
    """A grammar that waits for its trigger (tool_choice auto): before the call marker
    nothing is masked; from the marker on (it starts a token) llguidance's mask decides
    every step the best candidates do not (pure temperature: all of them), llama.cpp's
    lazy grammar confirming each token, and the call is valid."""
    grammar = tool_call_grammar([TOOL], "<tool_call>", "</tool_call>", parallel=False,
                                lazy=True)
    opening = runner.vocabulary.tokenize("Saving them.\n<tool_call>\n", add_special=False,
                                         parse_special=True)
    for seed in range(2):
        params = SamplingParams(temperature=1.0, seed=30 + seed, grammar=grammar.text,
                                grammar_triggers=grammar.lazy_patterns)
        tokens, full = generate(runner, params, 400, masks=masks, forced=opening)
        chain = LAST["sampler"]
        assert isinstance(chain, GrammarChain)
        assert not chain.unmasked and full == 0 and chain.masked == len(tokens) + 1
        text = runner.vocabulary.detokenize(tokens).strip().removesuffix("</tool_call>")
        jsonschema.validate(json.loads(text)["arguments"], SCHEMA)
    # no marker: nothing to mask (llama.cpp's grammar lets every token through)
    params = SamplingParams(temperature=1.0, seed=3, grammar=grammar.text,
                            grammar_triggers=grammar.lazy_patterns)
    generate(runner, params, 16, masks=masks)
    chain = LAST["sampler"]
    assert chain.unmasked and chain.matcher is None and chain.masked == 0

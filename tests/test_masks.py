"""engine/sampling/masks.py without a model: a mask's bits read back as token ids."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest

from engine.sampling.masks import MaskEngine


class BitsMatcher:
    """Stands in for llguidance's matcher: writes a fixed bit mask where it is asked to."""

    def __init__(self, ids: np.ndarray, n_vocab: int, junk_tail: bool) -> None:
        words = np.zeros((n_vocab + 31) // 32, np.uint32)
        np.bitwise_or.at(words, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
        if junk_tail and n_vocab % 32:  # bits past the vocabulary (padding) set too
            words[-1] |= np.uint32(0xFFFFFFFF) << np.uint32(n_vocab % 32)
        self.words = words

    def unsafe_compute_mask_ptr(self, address: int, size: int) -> None:
        assert size == self.words.nbytes
        ctypes.memmove(address, self.words.ctypes.data, size)


@pytest.mark.parametrize("n_vocab", [151_936, 32_000, 49_153, 33])
def test_allowed_reads_every_set_bit_as_its_token_id(n_vocab: int) -> None:
    engine = MaskEngine(None, n_vocab)
    rng = np.random.default_rng(n_vocab)
    for trial in range(60):
        k = int(rng.choice([0, 1, 2, 4, 31, 32, 33, 500, n_vocab // 2, n_vocab]))
        ids = np.sort(rng.choice(n_vocab, min(k, n_vocab), replace=False))
        if trial % 7 == 0:  # the edges: the first and last tokens
            ids = np.unique(np.concatenate([ids, [0, n_vocab - 1]]))
        got = engine.allowed(BitsMatcher(ids, n_vocab, junk_tail=trial % 2 == 1))
        assert got.dtype.kind == "i" and np.array_equal(got, ids), (n_vocab, k)


def test_a_prepared_grammar_is_not_converted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` (the prepare pool's threads, several at once) converts each grammar once;
    the engine thread's later look-up finds it done."""
    import threading

    import engine.sampling.masks as masks
    from engine.constraints.grammar import json_grammar

    calls: list[str] = []
    real = masks.gbnf_to_lark

    def counting(text: str) -> str:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(masks, "gbnf_to_lark", counting)
    engine = MaskEngine(None, 1000)
    if not engine.enabled:
        pytest.skip("llguidance is not installed")
    grammars = [json_grammar({"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                              "required": [f"k{i}"]}).text for i in range(6)]
    threads = [threading.Thread(target=engine.prepare, args=(grammars[i % 6],))
               for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(calls) == set(grammars)
    before = len(calls)
    assert all(engine._spec(g) for g in grammars)  # what a masked step asks for
    assert len(calls) == before


@pytest.fixture(scope="module")
def qwen_masks() -> Iterator[MaskEngine]:
    """A mask engine over Qwen2.5's real vocabulary (the model file read vocabulary only)."""
    import llama_cpp as L

    from conftest import require_model

    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(require_model("qwen-0.5b")).encode(), params)
    vocab = L.llama_model_get_vocab(model)
    engine = MaskEngine(vocab, L.llama_vocab_n_tokens(vocab))
    if not engine.enabled or engine.tokenizer() is None:
        L.llama_model_free(model)
        pytest.skip("llguidance is not installed")
    yield engine
    engine.close()
    L.llama_model_free(model)


def test_a_grammar_is_compiled_once_and_each_request_gets_its_own_matcher(
        qwen_masks: MaskEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request's matcher is a copy of one kept at the grammar's start: compiling took
    2.5-5.5 ms on the engine thread at every request's first masked step. ``prepare`` (the
    prepare pool) starts its compile once the tokenizer is built; the copies walk on their own,
    and a request that catches up on its tokens sees what a fresh compile would."""
    import llguidance

    from engine.constraints.grammar import json_grammar

    real = llguidance.LLMatcher
    built: list[str] = []

    def counting(*args: object, **kwargs: object) -> object:
        built.append("matcher")
        return real(*args, **kwargs)

    counting.grammar_from_lark = real.grammar_from_lark  # type: ignore[attr-defined]
    monkeypatch.setattr(llguidance, "LLMatcher", counting)
    grammar = json_grammar({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb"]}}},
        "required": ["name", "n"]}).text
    qwen_masks.prepare(grammar)  # starts the compile (not waited for)
    rng = np.random.default_rng(5)
    start = qwen_masks.allowed(qwen_masks.matcher(grammar, []))  # waits for that compile
    assert built == ["matcher"]
    for walk in range(6):
        m = qwen_masks.matcher(grammar, [])
        assert np.array_equal(qwen_masks.allowed(m), start), walk  # the kept one unmoved
        taken: list[int] = []
        for _ in range(int(rng.integers(1, 25))):
            ids = qwen_masks.allowed(m)
            if not len(ids) or m.is_accepting():
                break
            token = int(rng.choice(ids))
            assert m.consume_token(token)
            taken.append(token)
        later = qwen_masks.matcher(grammar, taken)  # a request catching up on its tokens
        fresh = real(qwen_masks.tokenizer(), qwen_masks._spec(grammar), log_level=0)
        assert fresh.consume_tokens(taken)
        assert np.array_equal(qwen_masks.allowed(later), qwen_masks.allowed(fresh))
        assert np.array_equal(qwen_masks.allowed(later), qwen_masks.allowed(m))
    assert built == ["matcher"]  # every request's matcher was a copy

"""Prefix reuse on a hybrid model (Gated DeltaNet recurrent layers + attention, llama.cpp's
``qwen35``), through real servers: every answer with the prefix cache on must equal the
answer computed from scratch (``cache_prompt: false``), whatever was cached before, ran
alongside, or was saved to disk by an earlier run. A recurrent state is one snapshot at a
sequence's last position, so a cached sequence may serve a prompt only whole, or from a
snapshot of its recurrent state taken during prefill (``engine.caches.prefix_cache``).

The model is the tiny random-weight one of ``tests/make_hybrid_model.py`` (written into the
model cache on first use).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from make_hybrid_model import default_path, write_hybrid_model
from openai import OpenAI

from conftest import ServerProcess, start_server

ALIAS = "qwen35-hybrid-tiny"
MAX_TOKENS = 16
SYSTEM = ("You are a terse assistant for a shipping company. Answer in one short sentence, "
          "never use lists, and always mention the tracking number if one is given. " * 3)
U1 = ("Where is parcel 7731-A? It left Rotterdam on Monday on a truck to the sorting centre "
      "in Duisburg, was scanned there twice and then loaded onto the overnight train to "
      "Hamburg. Since then the tracking page has shown nothing at all. " * 2)
U2 = "How long does a parcel from Lyon to Oslo usually take?"
U3 = "And when will it arrive?"
TOPICS = ["Bremen", "Hanover", "Kiel", "Leipzig"]


@dataclass(frozen=True)
class Answer:
    text: str
    logprobs: list[float]
    cached: int


@pytest.fixture(scope="module")
def model() -> Path:
    path = default_path()
    if not path.exists():
        write_hybrid_model(path)
    return path


def config(model: Path, n_seq_max: int, **extra: Any) -> dict[str, Any]:
    return {"model": {"path": str(model), "alias": ALIAS, "n_ctx": 2048, "n_seq_max": n_seq_max,
                      "n_batch": 256, "n_ubatch": 256, "threads": 1, "threads_batch": 1,
                      "max_output_tokens": 256}, **extra}


def ask(server: ServerProcess, messages: list[dict[str, str]], *, cache: bool = True
        ) -> Answer:
    client = OpenAI(base_url=server.base_url, api_key="none", timeout=120)
    r = client.chat.completions.create(
        model=ALIAS, messages=messages, temperature=0, max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
        logprobs=True, top_logprobs=1, extra_body={} if cache else {"cache_prompt": False})
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    details = r.usage.prompt_tokens_details if r.usage else None
    return Answer(choice.message.content or "", [c.logprob for c in choice.logprobs.content],
                  (details.cached_tokens or 0) if details else 0)


class Reference:
    """Answers computed from scratch on a server of their own, each asked once."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.known: dict[str, Answer] = {}

    def __call__(self, messages: list[dict[str, str]]) -> Answer:
        key = repr(messages)
        if key not in self.known:
            self.known[key] = ask(self.server, messages, cache=False)
        return self.known[key]


@pytest.fixture(scope="module")
def reference(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    server = start_server(config(model, 1), tmp_path_factory.mktemp("hybrid-ref"))
    yield Reference(server)
    server.stop()


def assert_same(got: Answer, ref: Answer, what: str, tolerance: float = 1e-3) -> None:
    """Same text, same logprobs (a state that read other tokens is off by about 1)."""
    assert got.text == ref.text, (what, got, ref)
    assert len(got.logprobs) == len(ref.logprobs), what
    worst = max((abs(a - b) for a, b in zip(got.logprobs, ref.logprobs, strict=True)),
                default=0.0)
    assert worst < tolerance, (what, worst)


def chat(user: str, *history: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    for i, text in enumerate(history):
        messages.append({"role": "assistant" if i % 2 == 0 else "user", "content": text})
    return messages


@pytest.mark.parametrize("n_seq_max", [4, 1])
def test_reused_prefixes_answer_as_from_scratch(model: Path, reference: Reference,
                                                tmp_path: Path, n_seq_max: int) -> None:
    server = start_server(config(model, n_seq_max), tmp_path)
    try:
        p1 = chat(U1)
        first = ask(server, p1)
        assert_same(first, reference(p1), "fresh prompt")
        assert_same(ask(server, p1), reference(p1), "the same prompt again")
        p3 = chat(U1, first.text, U3)  # the next turn: the cached sequence is all its prefix
        turn = ask(server, p3)
        assert_same(turn, reference(p3), "multi-turn append")
        assert turn.cached > 0  # reused whole, in place
        p2 = chat(U2)  # shares the system prompt only
        assert_same(ask(server, p2), reference(p2), "branch sharing the system prompt")
        # four at once: two the same (the second arrives while the first runs), all four
        # sharing the system prompt
        prompts = [chat(f"Is my parcel in {t}?") for t in TOPICS[:3]] + [
            chat(f"Is my parcel in {TOPICS[0]}?")]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda m: ask(server, m), prompts))
        for m, got in zip(prompts, answers, strict=True):
            # sequences decoded together are split into micro-batches differently than one
            # alone: up to ~1e-3 apart even when nothing is reused
            assert_same(got, reference(m), f"concurrent {m[-1]['content']!r}", 5e-3)
    finally:
        server.stop()


def test_snapshots_resume_part_of_a_cached_sequence(model: Path, reference: Reference,
                                                    tmp_path: Path) -> None:
    """Recurrent-state snapshots (``model.state_snapshots_max_bytes``): a prompt sharing
    only part of a cached sequence resumes from a snapshot, and answers as from scratch."""
    server = start_server(config(model, 4), tmp_path)
    try:
        p1 = chat(U1)
        first = ask(server, p1)
        assert_same(first, reference(p1), "fresh prompt")
        again = ask(server, p1)  # identical: resumes one token before the end
        assert_same(again, reference(p1), "the same prompt again")
        assert again.cached > 0
        p2 = chat(U2)  # another conversation, the same system prompt
        branch = ask(server, p2)
        assert_same(branch, reference(p2), "a second conversation")
        assert branch.cached > 0
        p3 = chat(U1, first.text, U3)  # an agent's next turn
        turn = ask(server, p3)
        assert_same(turn, reference(p3), "the next turn")
        assert turn.cached > 0
        p4 = chat(U1, first.text, "When exactly will it arrive in Hamburg?")  # retried
        retry = ask(server, p4)
        assert_same(retry, reference(p4), "a retried last turn")
        assert retry.cached > 0
    finally:
        server.stop()


def test_disk_cache_after_a_restart(model: Path, reference: Reference, tmp_path: Path) -> None:
    cfg = config(model, 4, disk_cache={"path": str(tmp_path / "disk"), "min_tokens": 32})
    p1 = chat(U1)
    server = start_server(cfg, tmp_path)
    try:
        first = ask(server, p1)  # its prompt is saved once computed
        assert_same(first, reference(p1), "fresh prompt")
    finally:
        server.stop()
    server = start_server(cfg, tmp_path)
    try:
        p3 = chat(U1, first.text, U3)  # the stored prompt is all a prefix of it: loaded
        turn = ask(server, p3)
        assert_same(turn, reference(p3), "multi-turn append from disk")
        assert turn.cached > 0
        for what, m in (("the stored prompt again", p1), ("a branch", chat(U2))):
            got = ask(server, m)
            assert_same(got, reference(m), what)
            assert got.cached > 0, what  # from the snapshots saved with the entries
    finally:
        server.stop()


def test_schema_answers_on_hybrid_memory_are_sampled_token_by_token(
        reference: Reference) -> None:
    """Tokens a grammar forces are not taken unsampled here (engine/drafts/forced.py): a
    token llama.cpp's grammar refused would have to be cut from a recurrent state, which
    keeps no snapshots without drafting. The answer validates; nothing is counted."""
    server = reference.server
    schema = {"type": "object", "additionalProperties": False, "required": ["where"],
              "properties": {"where": {"enum": ["the sorting centre in Duisburg",
                                                "the overnight train to Hamburg"]}}}
    client = OpenAI(base_url=server.base_url, api_key="none", timeout=120)
    r = client.chat.completions.create(
        model=ALIAS, messages=chat(U2), temperature=0, max_tokens=64,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {
            "name": "w", "strict": True, "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
    assert server.metrics().get("llamaserve_grammar_forced_tokens_total", 0.0) == 0.0

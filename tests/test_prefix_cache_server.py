"""Prefix reuse in memory and on disk, through real servers on the real models."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from conftest import ServerProcess, gemma_config, qwen_config, start_server

TOPICS = ["rivers", "bridges", "compilers", "violins", "glaciers", "tea", "comets", "looms",
          "harbors", "orchards", "lighthouses", "typewriters"]


def system_prompt(words: int, salt: str) -> str:
    """A long, deterministic system prompt (~1.3 tokens per word)."""
    lines, n, i = [f"You are the {salt} assistant. Follow these house rules."], 0, 0
    while n < words:
        t = TOPICS[i % len(TOPICS)]
        line = (f"Rule {i + 1}: when the user asks about {t}, answer in one short sentence "
                f"and mention {salt} item number {i * 7 % 97}.")
        lines.append(line)
        n += len(line.split())
        i += 1
    return "\n".join(lines)


NEAR_TIE = 0.5  # nats between the top two candidates


@dataclass
class Greedy:
    """A greedy answer with, per token, the margin between the best two candidates."""

    tokens: list[str]
    margins: list[float]
    cached: int

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def assert_same_greedy(warm: Greedy, cold: Greedy) -> None:
    """Reuse must not change answers. In a unified KV cache llama.cpp's CPU kernels give
    slightly different logits depending on where cells sit (even a cold prompt evaluated
    twice does), so the answers must agree up to the first near-tie, and a flip is only
    allowed at a near-tie."""
    for i, (w, c) in enumerate(zip(warm.tokens, cold.tokens, strict=False)):
        if w != c:
            assert cold.margins[i] < NEAR_TIE and i > 0, (warm.text, cold.text, i)
            return
        if cold.margins[i] < NEAR_TIE:
            return  # both agreed on a near-tie; what follows may drift legitimately
    assert warm.text == cold.text


def chat(client: OpenAI, system: str, question: str, **extra: Any) -> Greedy:
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=16, extra_body=extra, logprobs=True,
        top_logprobs=2,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    entries = r.choices[0].logprobs.content
    return Greedy([e.token for e in entries],
                  [e.top_logprobs[0].logprob - e.top_logprobs[1].logprob for e in entries],
                  r.usage.prompt_tokens_details.cached_tokens or 0)


def complete(client: OpenAI, prompt: list[int], **extra: Any) -> Greedy:
    r = client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0,
                                  logprobs=2, extra_body=extra)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    margins = []
    for top in lp.top_logprobs:
        best = sorted(top.values(), reverse=True)  # two ids may share a text: one key
        margins.append(best[0] - best[1] if len(best) > 1 else 0.0)
    return Greedy(lp.tokens, margins, r.usage.prompt_tokens_details.cached_tokens or 0)


def tokenize(server: ServerProcess, text: str) -> list[int]:
    r = httpx.post(f"{server.url}/v1/tokenize", json={"prompt": text}, timeout=30)
    tokens: list[int] = r.json()["tokens"]
    return tokens


def client_for(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def disk_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.lsc"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(qwen_config(), tmp_path_factory.mktemp("qwen-prefix"))
    yield server
    server.stop()


def test_partial_prefix_reuse_gives_the_cold_answer(qwen: ServerProcess) -> None:
    client = client_for(qwen)
    first = tokenize(qwen, system_prompt(450, "partial"))
    assert len(first) > 600
    client.completions.create(model="x", prompt=first, max_tokens=1, temperature=0)
    question = tokenize(qwen, "\n\nQuestion: which rule mentions comets? Answer: Rule")
    prompt = first[:500] + question  # shares only the first 500 of 600+ resident tokens

    warm = complete(client, prompt)
    assert warm.cached == 500  # a match ending inside the resident 600+-token prompt
    cold = complete(client, prompt, cache_prompt=False)
    assert cold.cached == 0
    assert_same_greedy(warm, cold)
    again = complete(client, prompt)
    assert again.cached == len(prompt) - 1  # the whole prompt is resident now
    assert_same_greedy(again, cold)
    m = qwen.metrics()
    assert m["llamaserve_prompt_tokens_cached_total{source=memory}"] >= 500 + len(prompt) - 1


def test_follow_up_turn_reuses_the_conversation(qwen: ServerProcess) -> None:
    client = client_for(qwen)
    system = system_prompt(300, "followup")
    first = chat(client, system, "What about tea?")
    assert first.cached < 20
    before = qwen.metrics()["llamaserve_prompt_tokens_total"]
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": system},
                  {"role": "user", "content": "What about tea?"},
                  {"role": "assistant", "content": first.text},
                  {"role": "user", "content": "And comets?"}])
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    reused = r.usage.prompt_tokens_details.cached_tokens or 0
    evaluated = qwen.metrics()["llamaserve_prompt_tokens_total"] - before
    assert reused > 400 and evaluated == r.usage.prompt_tokens - reused


def test_concurrent_requests_share_one_system_prompt(qwen: ServerProcess) -> None:
    client = client_for(qwen)
    system = system_prompt(500, "concurrent")
    questions = ["What about rivers?", "What about looms?", "What about violins?",
                 "What about harbors?"]
    before = qwen.metrics()["llamaserve_prompt_tokens_total"]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda q: chat(client, system, q), questions))
    evaluated = qwen.metrics()["llamaserve_prompt_tokens_total"] - before
    n_system = len(tokenize(qwen, system))
    cached = sorted(g.cached for g in results)
    assert cached[0] < 20  # one request computed the system prompt ...
    assert all(c >= n_system for c in cached[1:])  # ... and the other three reused it
    assert evaluated < 1.3 * n_system
    for warm, q in list(zip(results, questions, strict=True))[:2]:
        assert_same_greedy(warm, chat(client, system, q, cache_prompt=False))


def test_an_idle_conversation_is_parked_and_comes_back_with_the_cold_answer(
        qwen: ServerProcess) -> None:
    """One KV pool: when another request starts, an idle conversation leaves the pool for
    RAM (its cells no longer widen the other's attention) and its next request gets it back
    whole, with the answer a cold evaluation gives."""
    client = client_for(qwen)
    system = system_prompt(300, "parked")
    n_system = len(tokenize(qwen, system))
    chat(client, system, "What about orchards?")
    cells_alone = qwen.metrics()["llamaserve_kv_cells_used"]
    before = qwen.metrics()
    other = chat(client, system_prompt(200, "elsewhere"), "What about looms?")
    assert other.cached < 20
    m = qwen.metrics()
    assert m["llamaserve_parked_sequences"] >= 1
    # the pool holds the other conversation and nothing of this one
    assert m["llamaserve_kv_cells_used"] < cells_alone
    warm = chat(client, system, "What about orchards?")
    assert warm.cached >= n_system
    after = qwen.metrics()
    assert after["llamaserve_parked_sequences_restored_total"] \
        > before.get("llamaserve_parked_sequences_restored_total", 0)
    assert after["llamaserve_prompt_tokens_cached_total{source=ram}"] \
        - before.get("llamaserve_prompt_tokens_cached_total{source=ram}", 0) == warm.cached
    assert_same_greedy(warm, chat(client, system, "What about orchards?", cache_prompt=False))


def test_disk_cache_survives_restart_and_skips_bad_files(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    cfg = qwen_config()
    cfg["disk_cache"] = {"path": str(disk), "max_bytes": 1 << 30, "min_tokens": 64}
    system = system_prompt(400, "restart")
    server = start_server(cfg, tmp_path)
    try:
        client = client_for(server)
        cold = chat(client, system, "What about glaciers?")  # nothing cached yet
        assert cold.cached == 0
        assert chat(client, system, "What about bridges?").cached > 400
    finally:
        server.stop()  # SIGTERM: the writer flushes before exit
    files = sorted(disk_files(disk), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) == 2  # the first full prompt, then the prefix both prompts share
    full_glaciers = files[0]

    # a file another model wrote, and a damaged one of ours
    gemma_dir = tmp_path / "gemma-disk"
    gcfg = gemma_config()
    gcfg["disk_cache"] = {"path": str(gemma_dir), "min_tokens": 64}
    gemma = start_server(gcfg, tmp_path)
    try:
        client_for(gemma).completions.create(model="x", prompt=system, max_tokens=1)
    finally:
        gemma.stop()
    (foreign,) = disk_files(gemma_dir)
    shutil.copy(foreign, disk / foreign.name)
    raw = bytearray(full_glaciers.read_bytes())
    raw[-100] ^= 0xFF
    full_glaciers.write_bytes(raw)

    server = start_server(cfg, tmp_path)
    try:
        client = client_for(server)
        m = server.metrics()
        assert m["llamaserve_disk_cache_rejected_total{reason=incompatible}"] == 1
        assert (disk / foreign.name).exists()  # never served, left for LRU eviction
        # the damaged full prompt is found by its checksum, deleted, and the shared prefix
        # is loaded instead
        from_disk = chat(client, system, "What about glaciers?")
        assert from_disk.cached > 400
        assert_same_greedy(from_disk, cold)
        m = server.metrics()
        assert m["llamaserve_disk_cache_rejected_total{reason=corrupt}"] == 1
        assert not full_glaciers.exists()
        assert m["llamaserve_disk_cache_hits_total"] == 1
        assert m["llamaserve_prompt_tokens_cached_total{source=disk}"] == from_disk.cached
    finally:
        server.stop()


def test_disk_cache_respects_max_bytes_and_min_tokens(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    cfg = qwen_config()
    per_token = 12 * 1024  # Qwen2.5-0.5B f16 KV: 24 layers x 2 x 2 heads x 64 x 2 bytes
    cfg["disk_cache"] = {"path": str(disk), "max_bytes": 9 * 1024 * 1024, "min_tokens": 200}
    server = start_server(cfg, tmp_path)
    try:
        client = client_for(server)
        client.completions.create(model="x", prompt=system_prompt(80, "short"), max_tokens=1)
        server_flush_wait(server, saves=0)
        assert disk_files(disk) == []  # under min_tokens
        for i in range(4):
            client.completions.create(model="x", prompt=system_prompt(230, f"long{i}"),
                                      max_tokens=1)
        m = server_flush_wait(server, saves=4)
        total = sum(p.stat().st_size for p in disk_files(disk))
        assert 0 < total <= 9 * 1024 * 1024
        assert total > 200 * per_token
        assert m["llamaserve_disk_cache_evictions_total"] >= 1
        assert m["llamaserve_disk_cache_bytes"] == total
    finally:
        server.stop()


def server_flush_wait(server: ServerProcess, saves: int) -> dict[str, float]:
    """The writer works in the background: wait until it has written ``saves`` files."""
    import time

    deadline = time.monotonic() + 30
    while True:
        m = server.metrics()
        if m["llamaserve_disk_cache_saves_total"] >= saves or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


@pytest.mark.parametrize("swa_full", [False, True])
def test_sliding_window_model_reuses_only_what_is_valid(tmp_path: Path, swa_full: bool) -> None:
    """Gemma 3 uses sliding-window attention (512). Without swa_full its window cache has
    n_swa x n_seq_max + n_ubatch = 1,536 cells, so after 1,600+ tokens the start of the
    sequence is overwritten: a cut 200 tokens in cannot be reused, continuing at the end
    can. With swa_full both can. Either way the answer is the cold one."""
    server = start_server(gemma_config(swa_full=swa_full, n_seq_max=2), tmp_path)
    try:
        client = client_for(server)
        first = tokenize(server, system_prompt(1250, "window"))
        assert len(first) > 1600
        client.completions.create(model="x", prompt=first, max_tokens=1, temperature=0)

        tail = tokenize(server, " Rule")
        cut = first[:200] + tail
        warm = complete(client, cut)
        assert warm.cached == (200 if swa_full else 0)
        assert_same_greedy(warm, complete(client, cut, cache_prompt=False))
        ext = first + tail
        warm = complete(client, ext)
        assert warm.cached == len(first)
        assert_same_greedy(warm, complete(client, ext, cache_prompt=False))
    finally:
        server.stop()

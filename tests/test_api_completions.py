"""/v1/completions on the real Gemma 3 270M through a real server."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import ServerProcess, same_greedy_text


@pytest.fixture(scope="module")
def client(gemma_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=gemma_server.base_url, api_key="unused", max_retries=0)


PROMPT = "The capital of France is"


def test_completion_shape_and_model_alias(client: OpenAI) -> None:
    r = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == "gemma-3-270m"
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == 6
    assert r.usage.total_tokens == 14
    assert "Paris" in client.completions.create(
        model="x", prompt="Q: What is the capital of France?\nA: The capital of France is",
        max_tokens=4, temperature=0).choices[0].text


def test_greedy_is_deterministic_and_stream_matches(client: OpenAI) -> None:
    full = client.completions.create(model="x", prompt=PROMPT, max_tokens=20, temperature=0)
    again = client.completions.create(model="x", prompt=PROMPT, max_tokens=20, temperature=0)
    assert full.choices[0].text == again.choices[0].text
    chunks = list(client.completions.create(model="x", prompt=PROMPT, max_tokens=20,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1


def test_seed_gives_same_output_when_repeated(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        r = client.completions.create(model="x", prompt="Once upon a time", max_tokens=24,
                                      temperature=1.0, top_p=0.95, seed=seed)
        return r.choices[0].text

    assert sample(1234) == sample(1234)
    assert sample(0) == sample(0)  # seed 0 is a seed, not "random"
    outs = {sample(s) for s in (1, 2, 3, 4)}
    assert len(outs) > 1


def test_n_choices_are_distinct_and_indexed(client: OpenAI) -> None:
    r = client.completions.create(model="x", prompt="My favourite animal is", max_tokens=12,
                                  temperature=1.0, n=3, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1
    single = client.completions.create(model="x", prompt="My favourite animal is", max_tokens=1)
    assert single.usage is not None and r.usage is not None
    assert r.usage.prompt_tokens == single.usage.prompt_tokens  # counted once, not per choice
    assert r.usage.completion_tokens == 36


def test_stop_strings_never_appear(client: OpenAI) -> None:
    base = client.completions.create(model="x", prompt=PROMPT, max_tokens=30, temperature=0)
    text = base.choices[0].text
    stop = text.strip().split()[2]  # a word the model is going to produce
    r = client.completions.create(model="x", prompt=PROMPT, max_tokens=30, temperature=0,
                                  stop=[stop])
    assert stop not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    assert text.startswith(r.choices[0].text)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="x", prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop], stream=True))
    assert streamed == r.choices[0].text


def test_token_prompts_and_prompt_lists(gemma_server: ServerProcess, client: OpenAI) -> None:
    alone = client.completions.create(model="x", prompt=PROMPT, max_tokens=6, temperature=0,
                                      logprobs=5).choices[0]
    text = alone.text
    assert alone.logprobs is not None and alone.logprobs.tokens is not None
    assert alone.logprobs.top_logprobs is not None

    def same(other: str) -> bool:  # two prompts decode together: equal up to a near-tie
        assert alone.logprobs is not None
        return same_greedy_text(other, alone.logprobs.tokens or [],
                                alone.logprobs.top_logprobs or [])

    ids = httpx.post(f"{gemma_server.base_url}/tokenize", json={"prompt": PROMPT},
                     timeout=30).json()["tokens"]
    by_ids = client.completions.create(model="x", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == text
    r = client.completions.create(model="x", prompt=[PROMPT, "Paris is the capital of"],
                                  max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert same(r.choices[0].text), r.choices[0].text
    r = client.completions.create(model="x", prompt=[ids, ids], max_tokens=6, temperature=0)
    assert all(same(c.text) for c in r.choices), [c.text for c in r.choices]


def test_echo_and_logprobs(client: OpenAI) -> None:
    r = client.completions.create(model="x", prompt=PROMPT, max_tokens=5, temperature=0,
                                  echo=True, logprobs=3)
    c = r.choices[0]
    assert c.text.startswith(PROMPT)
    lp = c.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert "".join(lp.tokens).endswith(c.text[len(PROMPT) - 3:])
    assert lp.token_logprobs[0] is None  # nothing predicts the first token
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs is not None and len(lp.top_logprobs[-1]) == 3
    # greedy: every generated token is the top alternative
    for tok, top in zip(lp.tokens[-5:], lp.top_logprobs[-5:], strict=True):
        assert max(top, key=top.get) == tok
    plain = client.completions.create(model="x", prompt=PROMPT, max_tokens=5, temperature=0,
                                      logprobs=2).choices[0]
    assert plain.logprobs is not None and plain.logprobs.tokens is not None
    assert "".join(plain.logprobs.tokens) == plain.text


def test_max_tokens_length_and_stream_usage(client: OpenAI) -> None:
    chunks = list(client.completions.create(model="x", prompt=PROMPT, max_tokens=3,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks[:-1] if c.choices][-1] == "length"


async def _concurrent(url: str, count: int) -> list[str]:
    async with httpx.AsyncClient(timeout=120) as http:
        async def one(i: int) -> str:
            r = await http.post(f"{url}/completions", json={
                "prompt": f"Item {i}: the number after {i} is", "max_tokens": 16,
                "temperature": 0.7, "seed": i})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] in ("length", "stop")
            return str(choice["text"])
        return await asyncio.gather(*(one(i) for i in range(count)))


def test_sixteen_concurrent_requests_complete(gemma_server: ServerProcess) -> None:
    outs = asyncio.run(_concurrent(gemma_server.base_url, 16))
    assert len(outs) == 16 and all(isinstance(o, str) for o in outs)
    m = gemma_server.metrics()
    assert m["llamaserve_sequences_in_use"] == 0


def test_disconnect_mid_stream_frees_the_sequence(gemma_server: ServerProcess,
                                                  client: OpenAI) -> None:
    key = "llamaserve_sequences_finished_total{reason=cancelled}"
    before = gemma_server.metrics().get(key, 0.0)
    with httpx.stream("POST", f"{gemma_server.base_url}/completions", json={
            "prompt": "Write a very long story:", "max_tokens": 2000, "stream": True,
            "ignore_eos": True}, timeout=60) as r:
        lines = r.iter_lines()  # keep the iterator alive: dropping it closes the stream
        data = [line for line in (next(lines) for _ in range(6)) if line.startswith("data:")]
        assert len(data) == 3
        assert gemma_server.metrics()["llamaserve_sequences_in_use"] == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = gemma_server.metrics()
        if m["llamaserve_sequences_in_use"] == 0:
            break
        time.sleep(0.1)
    assert m["llamaserve_sequences_in_use"] == 0
    assert m[key] == before + 1
    r2 = client.completions.create(model="x", prompt=PROMPT, max_tokens=4, temperature=0)
    assert r2.choices[0].finish_reason == "length"


def test_disconnect_while_waiting_for_a_full_response(gemma_server: ServerProcess) -> None:
    key = "llamaserve_sequences_finished_total{reason=cancelled}"
    before = gemma_server.metrics().get(key, 0.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gemma_server.base_url}/completions", json={
            "prompt": "Write a very long story:", "max_tokens": 2000, "ignore_eos": True},
            timeout=1.5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and gemma_server.metrics().get(key, 0.0) == before:
        time.sleep(0.1)
    m = gemma_server.metrics()
    assert m[key] == before + 1 and m["llamaserve_sequences_in_use"] == 0


def test_context_overflow_is_context_length_exceeded(client: OpenAI) -> None:
    """A prompt that leaves no room for an answer; a ``max_tokens`` past the room is cut
    to it instead (tests/test_context_room.py)."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="x", prompt="word " * 4200, max_tokens=200)
    body = err.value.body
    assert isinstance(body, dict)
    assert body["code"] == "context_length_exceeded"
    assert "4096" in body["message"] and "model.n_ctx" in body["message"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "top_p": -1}, "top_p"),
        ({"prompt": "x", "stop": [1]}, "stop"),
        ({"prompt": "x", "logprobs": 50}, "logprobs"),
        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
    ],
)
def test_bad_inputs_get_400_error_objects(gemma_server: ServerProcess, payload: dict[str, object],
                                          param: str) -> None:
    r = httpx.post(f"{gemma_server.base_url}/completions", json=payload, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["message"] and set(err) == {"message", "type", "param", "code"}


def test_malformed_json_and_unknown_paths(gemma_server: ServerProcess) -> None:
    r = httpx.post(f"{gemma_server.base_url}/completions", content=b"{nope", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(f"{gemma_server.base_url}/completions", content=b"[1]", timeout=30)
    assert r.status_code == 400
    r = httpx.get(f"{gemma_server.url}/v1/nothing", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(f"{gemma_server.base_url}/completions", timeout=30)
    assert r.status_code == 405 and "error" in r.json()


def test_logit_bias_bans_and_forces_tokens(gemma_server: ServerProcess, client: OpenAI) -> None:
    first = client.completions.create(model="x", prompt=PROMPT, max_tokens=1,
                                      temperature=0).choices[0].text
    tok = httpx.post(f"{gemma_server.base_url}/tokenize", json={
        "prompt": first, "add_special": False}, timeout=30).json()["tokens"]
    assert len(tok) == 1
    banned = client.completions.create(model="x", prompt=PROMPT, max_tokens=1, temperature=0,
                                       logit_bias={str(tok[0]): -100}).choices[0].text
    assert banned != first
    forced_id = httpx.post(f"{gemma_server.base_url}/tokenize", json={
        "prompt": " banana", "add_special": False}, timeout=30).json()["tokens"][0]
    forced = client.completions.create(model="x", prompt=PROMPT, max_tokens=3, temperature=0,
                                       logit_bias={str(forced_id): 100}).choices[0].text
    assert forced.startswith(" banana")


def test_tokenize_detokenize_round_trip(gemma_server: ServerProcess) -> None:
    text = "Héllo wörld, 東京 👋"
    r = httpx.post(f"{gemma_server.base_url}/tokenize", json={
        "prompt": text, "add_special": False, "with_pieces": True}, timeout=30).json()
    assert r["count"] == len(r["tokens"]) > 0 and len(r["pieces"]) == r["count"]
    back = httpx.post(f"{gemma_server.base_url}/detokenize", json={"tokens": r["tokens"]},
                      timeout=30).json()
    assert back["prompt"] == text
    bad = httpx.post(f"{gemma_server.base_url}/detokenize", json={"tokens": [-1]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_models_health_and_metrics(gemma_server: ServerProcess, client: OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["gemma-3-270m"]
    assert httpx.get(f"{gemma_server.url}/healthz").json()["status"] == "ok"
    m = gemma_server.metrics()
    assert m["llamaserve_prompt_tokens_total"] > 0
    assert m["llamaserve_generated_tokens_total"] > 0
    assert m["llamaserve_sequences_total"] == 16


def test_full_shared_kv_ends_the_youngest_with_length(tmp_path_factory: pytest.TempPathFactory
                                                      ) -> None:
    """Four sequences without max_tokens grow in a 512-cell shared cache: the youngest
    ones end with "length" when it fills, and every request still completes. (The
    random-weight Qwen: the plumbing only, ~500 steps of four in seconds, not 20 s.)"""
    from conftest import start_server, tiny_qwen_config

    server = start_server(tiny_qwen_config(n_ctx=512, n_seq_max=4, max_output_tokens=4096),
                          tmp_path_factory.mktemp("kvfull"))
    try:
        async def run() -> list[dict[str, object]]:
            async with httpx.AsyncClient(timeout=300) as http:
                async def one(i: int) -> dict[str, object]:
                    r = await http.post(f"{server.base_url}/completions", json={
                        "prompt": f"Story number {i}:", "ignore_eos": True, "temperature": 0})
                    assert r.status_code == 200, r.text
                    return dict(r.json()["usage"]) | {
                        "finish": r.json()["choices"][0]["finish_reason"]}
                return await asyncio.gather(*(one(i) for i in range(4)))

        results = asyncio.run(run())
        assert all(r["finish"] == "length" for r in results)
        done = sorted(int(str(r["completion_tokens"])) for r in results)
        assert done[0] < 300  # ended early for lack of KV cells, not failed
        assert done[-1] > 450  # the oldest survivor ran to (nearly) the end of the context
        assert server.metrics()["llamaserve_sequences_in_use"] == 0
    finally:
        server.stop()

"""Sampling inside llama.cpp (``model.backend_sampling``, engine/sampling/backend.py), through
real servers on a real model (SmolLM2-135M-Instruct): one with it on, one with the engine's
own sampling. Greedy answers are the same text (up to a near-tie of batch-dependent
rounding), sampled ones are the same distribution (a chi-square test over many seeds), the
tokens were really sampled by llama.cpp (its counter), requests with the same sampling take
over an idle chain instead of rebuilding llama.cpp's graph, requests that need the logits
(logprobs, a schema, logit bias, penalties) share steps with it and get them, and a request
that loses its sequence while it waits (the Batch API's suspension) carries on."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from batch_lines import hold_every_sequence, lines, wait
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from conftest import ServerProcess, require_model, start_server

PROMPTS = ["Write a haiku about the sea.", "Name three fruits.", "What is 2 + 2?",
           "Describe a cat in one sentence."]
SAMPLED = "llamaserve_backend_sampled_tokens_total"
CHANGES = "llamaserve_backend_sampler_changes_total"
REUSES = "llamaserve_backend_sampler_reuses_total"


def config(backend: bool) -> dict[str, Any]:
    return {"model": {"path": require_model("smollm2"), "n_ctx": 4096, "n_seq_max": 4,
                      "threads": 2, "backend_sampling": backend}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, ServerProcess]]:
    tmp = tmp_path_factory.mktemp("backend-sampling")
    on = start_server(config(True), tmp)
    try:
        off = start_server(config(False), tmp)
        try:
            yield {True: on, False: off}
        finally:
            off.stop()
    finally:
        on.stop()


def chat(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=120,
                   json={"model": "m", **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def complete(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.base_url}/completions", timeout=120, json={"model": "m", **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def together(server: ServerProcess, bodies: list[dict[str, Any]], route: Any = chat,
             workers: int = 4) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda b: route(server, b), bodies))


def test_greedy_answers_are_the_same_as_the_engines_own(
        servers: dict[bool, ServerProcess]) -> None:
    """One at a time (the same step shapes on both servers) the text is the same, token for
    token; four at once, each answer is its own prompt's (its first tokens are those of
    its answer alone: later ones may part at a near-tie, as llama.cpp's sums round
    differently with the batch, conftest.NEAR_TIE)."""
    before = servers[True].metrics().get(SAMPLED, 0.0)
    # (ignore_eos: both run to the limit)
    bodies = [{"messages": [{"role": "user", "content": p}], "temperature": 0,
               "max_tokens": 40, "ignore_eos": True} for p in PROMPTS]
    alone = {on: [chat(servers[on], b) for b in bodies] for on in (True, False)}
    for a, b in zip(alone[True], alone[False], strict=True):
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    got = together(servers[True], bodies)  # four sequences in the same steps
    generated = sum(g["usage"]["completion_tokens"] for g in [*got, *alone[True]])
    assert servers[True].metrics()[SAMPLED] - before == generated  # the first tokens too
    assert SAMPLED not in servers[False].metrics()
    for answer, ref in zip(got, alone[False], strict=True):
        words = ref["choices"][0]["message"]["content"].split(" ")[:6]
        assert answer["choices"][0]["message"]["content"].split(" ")[:6] == words


def chi_square_same(a: Counter[str], b: Counter[str]) -> tuple[float, float]:
    """Two samples' homogeneity statistic over categories expected at least 5 times in
    each (the rest pooled), and its critical value at p = 0.001 (Wilson-Hilferty)."""
    na, nb = sum(a.values()), sum(b.values())
    common = [k for k in a.keys() | b.keys()
              if (a[k] + b[k]) * min(na, nb) / (na + nb) >= 5]
    cells = [(a[k], b[k]) for k in common]
    cells.append((na - sum(x for x, _ in cells), nb - sum(y for _, y in cells)))
    cells = [c for c in cells if c[0] + c[1] > 0]
    stat = 0.0
    for x, y in cells:
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = max(len(cells) - 1, 1)
    z = 3.09  # the normal quantile of 0.999
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def test_sampled_answers_are_the_same_distribution(servers: dict[bool, ServerProcess]) -> None:
    """The first three tokens of 240 answers, each with its own seed, at temperature 1 with
    llama-server's default truncation, four at a time (a seed of its own: every request
    attaches a new chain)."""
    bodies = [{"prompt": "Once upon a time, in a small village,", "max_tokens": 3,
               "temperature": 1.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": s,
               "logprobs": None} for s in range(240)]
    before = servers[True].metrics()
    draws: dict[bool, Counter[str]] = {}
    for on in (True, False):
        got = together(servers[on], bodies, complete)
        draws[on] = Counter(g["choices"][0]["text"] for g in got if g["usage"][
            "completion_tokens"] == 3)
    after = servers[True].metrics()
    assert after[SAMPLED] - before[SAMPLED] >= 3 * sum(draws[True].values())
    assert after[CHANGES] - before[CHANGES] >= 240  # a new chain per request
    assert sum(draws[True].values()) >= 200 and len(draws[True]) >= 20
    stat, crit = chi_square_same(draws[True], draws[False])
    assert stat < crit, (stat, crit, draws[True].most_common(10), draws[False].most_common(10))


SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 4.5e-41, 1e-38, 1e-30, 1e-6, 0.5, 1.0, 2.0])
    | st.floats(0, 2),
    "top_k": st.sampled_from([0, 1, 2, 40, 49151, 49152, 49153, 10**9]),
    "top_p": st.sampled_from([0.0, 1e-9, 0.5, 0.95, 1.0]) | st.floats(0, 1),
    "min_p": st.sampled_from([0.0, 0.05, 0.5, 0.98, 0.99, 0.999, 0.9999999, 1.0]),
    "seed": st.integers(-(2**63), 2**64 - 1)})


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sampling=SAMPLING)
def test_every_sampling_setting_samples_what_python_would(
        servers: dict[bool, ServerProcess], sampling: dict[str, Any]) -> None:
    """Any values the API takes (llama.cpp's graph forms abort or keep no candidate at some
    of them: those requests sample in Python). Where the setting leaves one candidate, the
    answer is greedy's (a temperature under 1e-30 overflowed llama.cpp's logit / temperature
    on either path, and sampled garbage)."""
    body = {"prompt": "Once upon a time", "max_tokens": 4, **sampling}
    got = {on: complete(servers[on], body)["choices"][0]["text"] for on in (True, False)}
    p = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, **sampling}
    if p["temperature"] <= 1e-5 or p["top_k"] == 1 or p["top_p"] <= 1e-9 or p["min_p"] >= 0.99:
        greedy = complete(servers[False], {**body, "temperature": 0})["choices"][0]["text"]
        assert got[True] == got[False] == greedy, (sampling, got, greedy)


def test_requests_sampling_the_same_way_take_over_idle_chains(
        servers: dict[bool, ServerProcess]) -> None:
    """Without a seed of their own, 40 requests with the same sampling, four at a time,
    rebuild llama.cpp's graph for none but the first on each sequence."""
    server = servers[True]
    bodies = [{"messages": [{"role": "user", "content": PROMPTS[i % 4]}], "max_tokens": 6,
               "temperature": 0.9, "top_p": 0.9} for i in range(40)]
    together(server, bodies[:4])
    before = server.metrics()
    got = together(server, bodies[4:])
    after = server.metrics()
    assert after[SAMPLED] - before[SAMPLED] == sum(g["usage"]["completion_tokens"] for g in got)
    assert after[REUSES] - before[REUSES] >= 32
    assert after[CHANGES] - before[CHANGES] <= 4


def test_prompt_logprobs_on_a_sequence_that_held_a_chain(
        servers: dict[bool, ServerProcess]) -> None:
    """Every sequence holds an idle chain (the test above); a prompt longer than one step's
    batch, echoed with its logprobs, has output rows in steps it is not sampled after:
    llama.cpp must not sample them, and their logprobs are the engine's own."""
    body = {"prompt": "The quick brown fox jumps over the lazy dog. " * 60, "max_tokens": 2,
            "echo": True, "logprobs": 1, "temperature": 0}
    got = {on: complete(servers[on], body)["choices"][0]["logprobs"] for on in (True, False)}
    assert len(got[True]["token_logprobs"]) > 512  # (n_batch: two prompt steps)
    assert got[True]["tokens"] == got[False]["tokens"]
    pairs = list(zip(got[True]["token_logprobs"], got[False]["token_logprobs"], strict=True))
    assert pairs[0] == (None, None)
    gaps = sorted(abs(a - b) for a, b in pairs[1:])
    # the same up to rounding that differs with the step's shape (median 0.0004-0.0006
    # nats, a few tokens up to ~0.35); another row's logits, or a stale row, would put
    # most tokens off by nats
    n = len(gaps)
    assert gaps[n // 2] < 0.005 and gaps[9 * n // 10] < 0.05 and gaps[-1] < 2, gaps[-10:]


def test_requests_that_need_the_logits_share_steps_with_it(
        servers: dict[bool, ServerProcess]) -> None:
    server = servers[True]
    schema = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 12},
                                               "count": {"type": "integer", "minimum": 1,
                                                         "maximum": 9}},
              "required": ["fruit", "count"], "additionalProperties": False}
    ask = [{"role": "user", "content": "Name a fruit and how many."}]
    bodies: list[dict[str, Any]] = [
        {"messages": ask, "max_tokens": 30, "temperature": 0.8, "seed": 1},
        {"messages": ask, "max_tokens": 12, "temperature": 0, "logprobs": True,
         "top_logprobs": 3},
        {"messages": ask, "max_tokens": 60, "temperature": 0.8, "seed": 2,
         "response_format": {"type": "json_schema", "json_schema": {
             "name": "f", "strict": True, "schema": schema}}},
        {"messages": ask, "max_tokens": 12, "temperature": 0.8, "seed": 3,
         "frequency_penalty": 1.5},
    ]
    before = server.metrics()
    for _ in range(3):
        plain, lp, structured, penalized = together(server, bodies)
        steps = lp["choices"][0]["logprobs"]["content"]
        assert len(steps) >= lp["usage"]["completion_tokens"] - 1  # (an ending has none)
        assert all(t["logprob"] <= 0 and t["top_logprobs"] for t in steps)
        # its own logits: its first tokens and their logprobs are the engine's own
        ref = chat(servers[False], bodies[1])["choices"][0]["logprobs"]["content"]
        for t, r in zip(steps[:3], ref[:3], strict=True):
            assert t["token"] == r["token"] and abs(t["logprob"] - r["logprob"]) < 0.3
        if structured["choices"][0]["finish_reason"] == "stop":
            jsonschema.validate(json.loads(structured["choices"][0]["message"]["content"]),
                                schema)
        assert plain["usage"]["completion_tokens"] > 0
        assert penalized["usage"]["completion_tokens"] > 0
    # only the plain request was sampled inside llama.cpp
    sampled = server.metrics()[SAMPLED] - before[SAMPLED]
    assert 0 < sampled <= 3 * 30


def test_a_schema_answer_with_logprobs_has_one_per_token(
        servers: dict[bool, ServerProcess]) -> None:
    """A grammar's forced tokens keep their logits when logprobs are asked for
    (engine/drafts/forced.py), also beside backend sampling, whose context keeps one output
    per step for the sequences llama.cpp samples: each token gets its logprob."""
    schema = {"type": "object", "additionalProperties": False, "required": ["fruit"],
              "properties": {"fruit": {"enum": ["a ripe yellow banana from Ecuador",
                                                "a small green apple from Normandy"]}}}
    body = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 40,
            "temperature": 0, "logprobs": True, "top_logprobs": 2,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "f", "strict": True, "schema": schema}}}
    for on in (True, False):
        got = chat(servers[on], body)
        choice = got["choices"][0]
        assert choice["finish_reason"] == "stop", got
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        steps = choice["logprobs"]["content"]
        assert len(steps) == got["usage"]["completion_tokens"] - 1  # (the ending has none)
        assert "".join(t["token"] for t in steps) == choice["message"]["content"]
        assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in steps)


def test_a_banned_token_stays_banned_beside_it(servers: dict[bool, ServerProcess]) -> None:
    """logit_bias is applied in Python (not eligible): its -100 holds while a backend
    sampled request runs in the same steps."""
    server = servers[True]
    probe = chat(server, {"messages": [{"role": "user", "content": "Count to five."}],
                          "temperature": 0, "max_tokens": 8, "logprobs": True})
    first = probe["choices"][0]["logprobs"]["content"][0]["token"]
    tok = httpx.post(f"{server.base_url}/tokenize", timeout=30,
                     json={"prompt": first, "add_special": False})
    assert tok.status_code == 200 and tok.json()["count"] == 1, tok.text
    banned = tok.json()["tokens"][0]
    bodies = [{"messages": [{"role": "user", "content": "Count to five."}],
               "temperature": 0, "max_tokens": 8, "logit_bias": {str(banned): -100},
               "logprobs": True},
              {"messages": [{"role": "user", "content": "Count to five."}],
               "temperature": 0.7, "max_tokens": 20, "seed": 5}]
    biased, _ = together(server, bodies)
    assert biased["choices"][0]["logprobs"]["content"][0]["token"] != first


def test_a_request_that_loses_its_sequence_carries_on(tmp_path: Path) -> None:
    """Both sequences hold batch lines when a user's request comes: a line gives its
    sequence up (its chain detached there) and later resumes, sampled in Python (llama.cpp
    aborts the process if a chain is attached twice): every line completes and the server
    stays up. (Their text is not compared: on this model a line that resumed parts from
    the same request alone beyond the near-tie bound with either sampling.)"""
    cfg = config(True)
    cfg["model"]["n_seq_max"] = 2
    cfg["server"] = {"batch_dir": str(tmp_path / "batches")}
    server = start_server(cfg, tmp_path)
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        bodies = [{"model": "m", "temperature": 0, "max_tokens": 64,
                   "messages": [{"role": "user", "content": f"Count from {i} to {i + 99}."}]}
                  for i in range(3)]
        batch = hold_every_sequence(server, client, bodies, 2)
        hi = chat(server, {"messages": [{"role": "user", "content": "Say hi."}],
                           "temperature": 0.7, "max_tokens": 4})
        assert hi["usage"]["completion_tokens"] > 0
        assert server.metrics()["llamaserve_sequences_suspended_total"] >= 1
        done = wait(client, batch.id)
        assert done.status == "completed" and done.output_file_id, done
        out = lines(client, done.output_file_id)
        assert server.metrics()[SAMPLED] > 0
        for i in range(len(bodies)):
            got = out[f"req-{i}"]["response"]
            assert got["status_code"] == 200, got
            answer, usage = got["body"]["choices"][0], got["body"]["usage"]
            assert answer["message"]["content"] and (
                answer["finish_reason"] == "stop" or usage["completion_tokens"] == 64)
        assert chat(server, {"messages": [{"role": "user", "content": "Say hi."}],
                             "max_tokens": 4})["usage"]["completion_tokens"] > 0
    finally:
        server.stop()

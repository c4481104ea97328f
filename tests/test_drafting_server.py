"""Draft decoding on real models: the same greedy answers, valid sampled and constrained ones."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI

from conftest import ROOT, ServerProcess, gemma_config, qwen_config, require_model, start_server

CODE = "\n".join(f"def area_{i}(width, height):\n    return width * height + {i}\n"
                 for i in range(8))
NEAR_TIE = 0.5
CONCURRENT = 4  # requests at once (8 cost CI a minute more)


def prompt(i: int) -> list[Any]:
    return [{"role": "user", "content": f"Copy this code exactly, then add a one-line comment "
                                        f"`# version {i}` at the top:\n```python\n{CODE}```"}]


def answer(client: OpenAI, i: int, **kwargs: Any) -> tuple[list[str], list[float]]:
    r = client.chat.completions.create(model="x", messages=prompt(i), max_tokens=96,
                                       logprobs=True, top_logprobs=2, **kwargs)
    content = r.choices[0].logprobs.content or []  # type: ignore[union-attr]
    return ([e.token for e in content],
            [e.top_logprobs[0].logprob - e.top_logprobs[1].logprob for e in content])


def completion_tokens(body: dict[str, Any]) -> tuple[list[str], list[float]]:
    """Tokens of a /v1/completions answer and each one's lead over the runner-up."""
    lp = body["choices"][0]["logprobs"]
    margins = [sorted(top.values(), reverse=True) for top in lp["top_logprobs"]]
    return lp["tokens"], [m[0] - m[1] if len(m) > 1 else 99.0 for m in margins]


def same_greedy(a: tuple[list[str], list[float]], b: tuple[list[str], list[float]]) -> None:
    """Token for token, up to the first near-tie (llama.cpp's CPU kernels give slightly
    different logits for different batch shapes; a flip is only allowed at a near-tie)."""
    for i, (x, y) in enumerate(zip(a[0], b[0], strict=False)):
        if x != y:
            assert b[1][i] < NEAR_TIE, (i, x, y, "".join(a[0]), "".join(b[0]))
            return
        if b[1][i] < NEAR_TIE:
            return
    assert a[0] == b[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[dict[int, tuple[list[str], list[float]]]]:
    server = start_server(qwen_config(n_seq_max=8), tmp_path_factory.mktemp("nodraft"))
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                        timeout=300)
        # at once, as the drafted servers answer them (same_greedy allows the flips that
        # other batch shapes can cause at near-ties)
        with ThreadPoolExecutor(CONCURRENT) as pool:
            answers = list(pool.map(lambda i: answer(client, i, temperature=0),
                                    range(CONCURRENT)))
        yield dict(enumerate(answers))
    finally:
        server.stop()


MODES = {
    "prompt-lookup": {"draft_model": "prompt-lookup-decoding"},
    # the 0.5B model drafting for itself: the same vocabulary, and fast enough for CI
    "draft-model": {"draft_model": "draft-model", "draft_model_num_pred_tokens": 4},
}


@pytest.fixture(scope="module", params=list(MODES))
def drafted(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    extra = dict(MODES[request.param])
    if extra["draft_model"] == "draft-model":
        extra["draft_model_path"] = require_model("qwen-0.5b")
    server = start_server(qwen_config(n_seq_max=8, **extra),
                          tmp_path_factory.mktemp(f"draft-{request.param}"))
    yield server
    server.stop()


def test_greedy_output_is_unchanged_single_and_concurrent(
        drafted: ServerProcess, reference: dict[int, tuple[list[str], list[float]]]) -> None:
    client = OpenAI(base_url=drafted.base_url, api_key="unused", max_retries=0, timeout=300)
    lookup = "prompt" in drafted.log_path.parent.name
    same_greedy(reference[0], answer(client, 0, temperature=0))
    # 4 at once with prompt lookup; the draft model (the 0.5B drafting for itself doubles
    # every step's work) with 3, which still batches drafts of several sequences
    n = CONCURRENT if lookup else 3
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: answer(client, i, temperature=0), range(n)))
    for i, result in enumerate(results):
        same_greedy(reference[i], result)
    m = drafted.metrics()
    # prompt lookup on a copy task drafts a lot; a draft model as large as the target
    # is not worth its cost once the engine has measured it, so it stops drafting early
    least = 100 if lookup else 0
    assert m["llamaserve_draft_tokens_accepted_total"] > least
    assert 0 < m["llamaserve_draft_acceptance_rate"] <= 1
    assert m["llamaserve_requests_running"] == 0


def test_seeded_sampling_with_drafts_is_valid_and_repeatable(drafted: ServerProcess) -> None:
    """The same seed draws the same numbers, so two runs agree token for token, except
    where logits that differ in the last bits (other batch shapes and KV cells: draft
    lengths adapt to what the engine measured so far) move a draw across the boundary
    between two candidates; then both tokens must be among the other run's top
    candidates at that position."""
    client = OpenAI(base_url=drafted.base_url, api_key="unused", max_retries=0, timeout=300)
    runs = [client.chat.completions.create(model="x", messages=prompt(3), max_tokens=80,
                                           temperature=0.9, top_p=0.95, seed=1234,
                                           logprobs=True, top_logprobs=5)
            for _ in range(2)]
    for r in runs:
        assert r.choices[0].message.content and r.usage is not None
        assert r.choices[0].finish_reason in ("stop", "length")
    a, b = ([e for e in r.choices[0].logprobs.content or []]  # type: ignore[union-attr]
            for r in runs)
    for x, y in zip(a, b, strict=False):
        if x.token != y.token:
            assert y.token in {t.token for t in x.top_logprobs}, (x, y)
            assert x.token in {t.token for t in y.top_logprobs}, (x, y)
            break
    else:
        assert len(a) == len(b)


def test_json_schema_with_drafts_stays_valid(drafted: ServerProcess) -> None:
    client = OpenAI(base_url=drafted.base_url, api_key="unused", max_retries=0, timeout=300)
    schema = {"type": "object", "properties": {
        "functions": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "count": {"type": "integer"}}, "required": ["functions", "count"]}
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=200, messages=prompt(1),
        response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_bad_draft_setups_fail_at_start(tmp_path: Path) -> None:
    for extra, message in (
            ({"draft_model": "draft-model", "draft_model_path": require_model("gemma")},
             "does not share the target model's vocabulary"),
            ({"draft_model": "draft-mtp"}, "needs a model with MTP")):
        cfg = qwen_config(**extra)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(cfg))
        proc = subprocess.run([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                               "--port", "0"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert gemma_config()  # (the Gemma file exists: fetched by the test run)


def test_prompt_lookup_on_a_sliding_window_model_rolls_back_cleanly(
        gemma_server: ServerProcess, tmp_path: Path) -> None:
    """Gemma 3 keeps most layers in a sliding-window KV: rejected drafts leave it too, and
    greedy text stays the model's own."""
    cfg = gemma_config()
    cfg["model"]["draft_model"] = "prompt-lookup-decoding"
    drafted = start_server(cfg, tmp_path)
    code = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(30))
    try:
        for prompt in (code + "\n" + code[:200], "Once upon a time"):
            body = {"model": "x", "prompt": prompt, "max_tokens": 100, "temperature": 0,
                    "logprobs": 2}
            plain, fast = (completion_tokens(httpx.post(
                f"{s.url}/v1/completions", json=body, timeout=300).json())
                for s in (gemma_server, drafted))
            same_greedy(plain, fast)
        assert drafted.metrics()["llamaserve_draft_tokens_accepted_total"] > 50
    finally:
        drafted.stop()


@pytest.mark.parametrize("n_seq_max", [1, 4])
def test_mtp_drafts_on_a_hybrid_model_keep_greedy_text(n_seq_max: int, tmp_path: Path) -> None:
    """``draft-mtp`` through llama.cpp on the random-weight Qwen3.5-architecture file with an
    MTP block (``tests/make_hybrid_model.py --mtp``): the head drafts, verification rejects
    its guesses and rolls the recurrent state back, and greedy text (1 and 4 concurrent
    requests) is the model's own. (Drafts that get accepted need a trained head:
    ``bench/make_mtp_model.py``, ``bench/mtp.py``.)"""
    from make_hybrid_model import default_path, write_hybrid_model
    path = default_path(mtp=True)
    if not path.exists():
        write_hybrid_model(path, mtp=True)
    model = {"path": str(path), "alias": "x", "n_ctx": 2048, "n_seq_max": n_seq_max,
             "n_batch": 256, "n_ubatch": 256, "threads": 1, "threads_batch": 1}
    prompts = ["def parse(line):\n", "Once upon a time", "import os\nimport sys\n",
               "The shipping company"][:n_seq_max]

    def texts(server: ServerProcess) -> list[str]:
        def one(p: str) -> str:
            r = httpx.post(f"{server.url}/v1/completions", timeout=300, json={
                "model": "x", "prompt": p, "max_tokens": 24, "temperature": 0})
            r.raise_for_status()
            return str(r.json()["choices"][0]["text"])
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(one, prompts))

    plain = start_server({"model": model}, tmp_path)
    try:
        expected = texts(plain)
    finally:
        plain.stop()
    drafted = start_server({"model": {**model, "draft_model": "draft-mtp"}}, tmp_path)
    try:
        assert texts(drafted) == expected
        assert drafted.metrics()["llamaserve_draft_tokens_proposed_total"] > 0
    finally:
        drafted.stop()

"""Generated request bodies never get a 5xx, and the server stays healthy (short run; the
long one is bench/fuzz.py). The server has a projector and two LoRA adapters, so images,
audio and adapter choices go through their real paths; afterwards an image request still
works."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

import media_samples as samples
from conftest import ServerProcess, reranker_config, start_server
from fuzz_bodies import (
    RERANKERS,
    check_error_shape,
    fuzz_config,
    hostile_bodies,
    media_bodies,
    post,
    post_raw,
    request_bodies,
    rerank_bodies,
    session_cases,
    ws_exchange,
    ws_frames,
)
from fuzz_schemas import schema_cases

EXAMPLES = 300
HOSTILE_EXAMPLES = 300
RERANK_EXAMPLES = 40  # each runs both rerankers; bench/fuzz.py draws more
MEDIA_EXAMPLES = 200
WS_EXAMPLES = 100
IMAGE_TOKENS = 4  # the test projector: any image is 2 x 2 patches
ACCEPTED_BODIES: list[tuple[str, Any]] = [
    ("/v1/detokenize", {"tokens": [3606, 55, 40]}),
    ("/v1/tokenize", {"prompt": "", "add_special": True}),
    ("/apply-template", {"messages": [{"role": "user", "content": "Hi"}],
                         "tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("/v1/embeddings", {"input": "Y\u00c3`Q", "encoding_format": "base64", "dimensions": 9}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 2}),
    ("/api/chat", {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hi"}],
                   "options": {"num_predict": 2}}),
    ("/api/generate", {"model": "gemma-3-270m:latest", "prompt": "Hi", "stream": False,
                       "format": "json", "options": {"num_predict": 2, "temperature": 0}}),
    ("/api/embed", {"model": "gemma-3-270m", "input": ["Hi", "there"], "dimensions": 9}),
    ("/api/embeddings", {"model": "gemma-3-270m", "prompt": "Hi"}),
    ("/api/show", {"model": "style-a"}),
    ("/api/pull", {"model": "gemma-3-270m", "stream": False}),
]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    server = start_server(fuzz_config(tmp), tmp)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(fuzz_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as client:
        yield client


def test_generated_bodies_never_get_a_5xx(fuzz_server: ServerProcess,
                                          http: httpx.Client) -> None:
    statuses: dict[int, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(request_bodies())
    def check(case: tuple[str, Any]) -> None:
        r = post(http, case)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case, r.text)
        check_error_shape(r)

    check()
    assert sum(statuses.values()) >= EXAMPLES
    assert sum(v for k, v in statuses.items() if k >= 400) > 10  # refused bodies were exercised
    # ...and accepted ones: only a few percent of generated bodies are valid, and which ones
    # Hypothesis generates depends on the modules loaded before (it draws literals from
    # them), so the accepted paths are also exercised with bodies known to be valid
    for case in ACCEPTED_BODIES:
        r = post(http, case)
        assert r.status_code == 200, (case, r.text)
    assert_healthy_and_media_works(fuzz_server, http)


def test_hostile_bodies_get_a_4xx_error_object_and_no_connection_drops(
        fuzz_server: ServerProcess, http: httpx.Client) -> None:
    """Deep nesting, surrogates / NUL / non-BMP text in values and keys, huge and
    non-finite numbers, every numeric field at its type boundaries, duplicated keys,
    invalid UTF-8, long strings and arrays."""
    statuses: dict[int, int] = {}
    dropped: list[bytes] = []

    @settings(max_examples=HOSTILE_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(hostile_bodies())
    def check(case: tuple[str, bytes]) -> None:
        r = post_raw(http, case)
        if r is None:
            dropped.append(case[1][:200])
            return
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        check_error_shape(r)

    check()
    assert not dropped, dropped[:3]
    assert statuses.get(400, 0) > 50 and statuses.get(200, 0) > 5, statuses
    assert_healthy_and_media_works(fuzz_server, http)


def test_websocket_frames_get_an_answer_on_a_socket_that_stays_usable(
        fuzz_server: ServerProcess) -> None:
    """Text and binary frames, hostile bodies, junk bytes, frames past max_body_bytes and
    a second response.create while one is in flight, all on ONE connection: every frame
    is answered (an error event or a terminal response event) and the socket stays open."""
    seen: dict[str, int] = {}
    with connect(f"ws://127.0.0.1:{fuzz_server.port}/v1/responses",
                 max_size=None) as ws:

        @settings(max_examples=WS_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(ws_frames())
        def check(case: tuple[str, str | bytes]) -> None:
            kind, frame = case
            for outcome in ws_exchange(ws, kind, frame):
                seen[outcome] = seen.get(outcome, 0) + 1
                if outcome.startswith("error:"):
                    assert int(outcome.rsplit(":", 1)[1]) < 500, (kind, frame[:200], outcome)

        check()
        # still usable after everything, and a broken image still gets its own error
        # (whether the drawn media frames hold one varies with the run's tmp paths)
        assert ws_exchange(ws, "valid", '{"type": "response.create", "input": "Hi", '
                           '"max_output_tokens": 2}')[0].startswith("response.")
        broken = {"type": "response.create", "max_output_tokens": 2, "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}
        assert ws_exchange(ws, "media", json.dumps(broken)) == ["error:invalid_media:400"]
    assert any(k.startswith("response.") for k in seen), seen
    assert seen.get("error:request_too_large:413", 0) > 0, seen
    assert any(k.startswith("error:response_in_progress") for k in seen), seen
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as http:
        assert_healthy_and_media_works(fuzz_server, http)


def http_health(server: ServerProcess) -> int:
    return httpx.get(f"{server.url}/healthz", timeout=10).status_code


def assert_healthy_and_media_works(server: ServerProcess, http: httpx.Client) -> None:
    """Healthy, nothing left running, and an image and an adapter still work: the image's
    tokens are in the prompt (it went through the projector) and the answer is a 200."""
    assert http.get("/healthz").status_code == 200
    m = server.metrics()
    assert m["llamaserve_requests_running"] == 0 and m["llamaserve_engine_alive"] == 1

    def ask(*parts: dict[str, Any], **extra: Any) -> httpx.Response:
        return http.post("/v1/chat/completions", json={"max_tokens": 2, "temperature": 0,
                         **extra, "messages": [{"role": "user", "content": [
                             {"type": "text", "text": "What is this?"}, *parts]}]})

    def image() -> dict[str, Any]:  # a new image: encoded now, not from a cache
        data = base64.b64encode(samples.png(5, next(_FRESH))).decode()
        return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}}

    encoded = m["llamaserve_media_encode_seconds_count"]
    one, two = ask(image()), ask(image(), image())
    adapter = ask(lora=[{"name": "style-b", "scale": 0.5}])
    assert one.status_code == two.status_code == adapter.status_code == 200, \
        (one.text, two.text, adapter.text)
    # the second image adds its tokens and nothing else (same text boundaries)
    assert (two.json()["usage"]["prompt_tokens"]
            == one.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS)
    assert server.metrics()["llamaserve_media_encode_seconds_count"] == encoded + 3


_FRESH = itertools.count(7)  # image heights no request has sent


def test_media_and_lora_inputs_never_get_a_5xx(fuzz_server: ServerProcess,
                                               http: httpx.Client) -> None:
    """Images and audio as data: URLs (valid, truncated, corrupt after the magic, headers
    claiming 65535 x 65535 pixels or 2^36 samples, bad base64, percent junk, too large),
    http(s) URLs to private, reserved and .invalid hosts (numeric, IDNA, userinfo, bad
    ports), file: URLs in and out of the media root (symlinks out, /dev/zero, a FIFO, ..,
    %00), other schemes and non-strings; in every role's message, Responses items and tool
    output, Anthropic blocks; more parts than max_media_per_request; every shape of the
    ``lora`` field and ``model`` naming an adapter. Never a 5xx, every error in the API's
    shape, and the media path still works afterwards."""
    statuses: dict[int, int] = {}
    codes: dict[str, int] = {}

    @settings(max_examples=MEDIA_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(media_bodies())
    def check(case: tuple[str, Any]) -> None:
        r = post(http, case)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case, r.text)
        check_error_shape(r)
        if r.status_code >= 400 and not case[0].startswith("/api/"):  # Ollama's: no code
            error = r.json()["error"]
            code = str(error.get("code") or error["type"])
            codes[code] = codes.get(code, 0) + 1

    check()
    assert statuses.get(200, 0) >= 10 and statuses.get(400, 0) >= 50, statuses
    # Ollama's routes (their errors carry no code) take a share of the cases: 17 of these
    # came back invalid_media once they joined
    assert codes.get("invalid_media", 0) >= 15 and codes.get("lora_not_found", 0) >= 3, codes
    assert_healthy_and_media_works(fuzz_server, http)


BOMBS = {  # name: (bytes, kind, what the message says)
    "flac-2^36-samples-at-1hz": (samples.flac_claiming(), "audio", "audio too long"),
    "flac-2^36-samples-at-16khz": (samples.flac_claiming(rate=16000), "audio", "too long"),
    "id3-then-flac": (samples.ID3_EMPTY + samples.flac_claiming(), "audio", "too long"),
    "mp3-xing-1e6-frames": (samples.mp3_xing(1_000_000), "audio", "audio too long"),
    "wav-at-1hz": (samples.wav_claiming(rate=1, bits=8, payload=bytes(20_000)), "audio",
                   "audio too long"),
    "gif-65535x65535": (samples.gif_claiming(65535, 65535), "image", "65535 × 65535 pixels"),
    "bmp-20000x20000": (samples.bmp_claiming(20000, 20000), "image", "20000 × 20000 pixels"),
    "jpeg-65535x65535": (samples.jpeg_claiming(65535, 65535), "image", "65535 × 65535"),
    "png-zlib-bomb-2049x2048": (samples.png_bomb(2049, 2048), "image", "2049 × 2048 pixels"),
    "jpeg-1000-scans": (samples.jpeg_claiming(2048, 2048, scans=1000), "image", "1000 scans"),
    "png-16x16-inflating-to-30mb": (samples.png_claiming(16, 16, samples.zeros_zlib(30 << 20)),
                                    "image", "inflates to more than the 784 bytes"),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_decompression_bombs_are_a_400_and_the_server_lives(
        fuzz_server: ServerProcess, http: httpx.Client, name: str) -> None:
    """Headers claiming what the decoders would allocate are refused before llama.cpp sees
    them. Before the fix the 42-byte FLACs (also behind an ID3 tag, which sniffs as MP3)
    made mtmd throw std::bad_alloc (the process aborted), the 1 kB MP3 made it allocate
    1.7 GB for 10 s, the GIF asked stb_image for 38 GB and filled it, the BMP decoded for
    22 s, the 22 kB JPEG for 13 s, and stb_image inflated PNG data far past the pixels
    (1 MB of 16 x 16 pixels: 954 MB)."""
    data, kind, words = BOMBS[name]
    b64 = base64.b64encode(data).decode()
    part = ({"type": "input_audio", "input_audio": {"data": b64}} if kind == "audio" else
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}})
    started = time.monotonic()
    r = http.post("/v1/chat/completions", json={"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_media" and words in r.json()["error"][
        "message"], r.text
    assert time.monotonic() - started < 5
    assert fuzz_server.proc.poll() is None and http_health(fuzz_server) == 200


SESSION_EXAMPLES = 80


def test_session_keys_and_response_ids_never_get_a_5xx_or_escape_the_store(
        fuzz_server: ServerProcess, http: httpx.Client, tmp_path_factory: Any) -> None:
    """Routing keys (x-session-id, session_id, user, metadata.user_id) of any bytes and
    length, and response ids made to escape the store's directory: a clear answer, an
    echoed key that is a valid header, and nothing written outside the store."""
    store = Path(json.loads(next(Path(fuzz_server.log_path.parent).glob("config-*.json"))
                            .read_text())["server"]["responses_store_path"])
    statuses: dict[int, int] = {}

    @settings(max_examples=SESSION_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(session_cases())
    def check(case: tuple[str, str, dict[str, bytes], bytes]) -> None:
        method, path, headers, body = case
        r = http.request(method, path, headers=headers, content=body or None)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        check_error_shape(r)
        echoed = r.headers.get("x-session-id")
        if echoed is not None:
            assert 0 < len(echoed) <= 256 and echoed.isprintable(), echoed
        if r.status_code == 200 and path == "/v1/responses":
            rid = r.json()["id"]
            assert http.get(f"/v1/responses/{rid}").status_code == 200
            assert (store / f"{rid}.json").is_file()

    check()
    assert statuses.get(200, 0) > 10 and statuses.get(404, 0) > 10, statuses
    stray = [p for p in store.parent.rglob("*") if p.is_file() and store not in p.parents
             and p.suffix == ".json" and p.name.startswith("resp_")]
    assert not stray, stray
    markers = store / ".background"  # background runs' locks (api/responses/background.py)
    assert all(p.parent in (store, markers) for p in store.rglob("*"))
    assert http.get("/healthz").status_code == 200


SCHEMA_EXAMPLES = 160
WS_SCHEMA_EXAMPLES = 40


def test_hostile_schemas_never_get_a_5xx_nor_stop_the_server(
        fuzz_server: ServerProcess, http: httpx.Client) -> None:
    """Every schema keyword the converter reads at its worst value (tests/fuzz_schemas.py),
    in every place a request carries a schema: chat tools and response_format, Responses
    tools and text.format, Anthropic input_schema and output_config.format, hundreds of
    tools. Before the grammar bounds, one ``maxLength: 524288`` segfaulted the process.
    Each answer is a 200 or a 4xx error object, within a bounded time, and the server
    stays up and healthy."""
    statuses, slowest = post_all(fuzz_server, http, schema_cases(), SCHEMA_EXAMPLES)
    assert statuses.get(200, 0) >= 20 and statuses.get(400, 0) >= 10, statuses
    assert slowest < 30, slowest
    assert_healthy_and_media_works(fuzz_server, http)


def post_all(server: ServerProcess, http: httpx.Client,
             cases: st.SearchStrategy[tuple[str, Any]], examples: int
             ) -> tuple[dict[int, int], float]:
    """Each drawn (path, body) posted: never a 5xx, errors in the API's shape, the server
    up. Returns the statuses seen and the slowest answer's seconds."""
    statuses: dict[int, int] = {}
    slowest = 0.0

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(cases)
    def check(case: tuple[str, Any]) -> None:
        nonlocal slowest
        started = time.monotonic()
        r = post(http, case)
        slowest = max(slowest, time.monotonic() - started)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case[0], json.dumps(case[1])[:300], r.text[:300])
        check_error_shape(r)
        assert server.proc.poll() is None, (case[0], json.dumps(case[1])[:300])

    check()
    return statuses, slowest


CUSTOM_EXAMPLES = 60


def test_hostile_custom_grammars_never_get_a_5xx_nor_stop_the_server(
        fuzz_server: ServerProcess, http: httpx.Client) -> None:
    """A Responses custom tool's Lark or regex grammar at its worst (tests/fuzz_schemas.py):
    a 200 or a 400 naming the tool's format, within a bounded time; the server stays up."""
    customs = schema_cases().filter(lambda case: "custom" in json.dumps(case[1].get("tools")))
    statuses, slowest = post_all(fuzz_server, http, customs, CUSTOM_EXAMPLES)
    assert statuses.get(200, 0) >= 5 and statuses.get(400, 0) >= 5, statuses
    assert slowest < 30, slowest
    assert_healthy_and_media_works(fuzz_server, http)


def test_hostile_schemas_in_websocket_frames_get_an_answer(fuzz_server: ServerProcess) -> None:
    """The Responses bodies of the schema fuzz as ``response.create`` frames on one
    WebSocket: each is answered (a response or an error event under 500) on a socket that
    stays open."""
    seen: dict[str, int] = {}
    with connect(f"ws://127.0.0.1:{fuzz_server.port}/v1/responses", max_size=None) as ws:

        @settings(max_examples=WS_SCHEMA_EXAMPLES, deadline=None, database=None,
                  derandomize=True, suppress_health_check=list(HealthCheck))
        @given(schema_cases().filter(lambda case: case[0] == "/v1/responses"))
        def check(case: tuple[str, Any]) -> None:
            frame = json.dumps({"type": "response.create", **case[1]})
            for outcome in ws_exchange(ws, "valid", frame):
                seen[outcome] = seen.get(outcome, 0) + 1
                if outcome.startswith("error:"):
                    assert int(outcome.rsplit(":", 1)[1]) < 500, (frame[:300], outcome)
            assert fuzz_server.proc.poll() is None, frame[:300]

        check()
    assert any(k.startswith("response.") for k in seen), seen
    assert any(k.startswith("error:") for k in seen), seen
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as http:
        assert_healthy_and_media_works(fuzz_server, http)


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Both generated rerankers (a BERT cross-encoder, a Qwen3-style LLM reranker whose
    prompts come from a template that parses special tokens) behind one server."""
    tmp = tmp_path_factory.mktemp("fuzz-rerank")
    models = [reranker_config(kind, n_seq_max=8)["model"] for kind in ("bert", "qwen3")]
    server = start_server({"server": {"max_body_bytes": 65536}, "models": models}, tmp)
    yield server
    server.stop()


def test_rerank_worst_values_never_get_a_5xx(rerank_server: ServerProcess) -> None:
    """Special-token text and the template's placeholders in queries and documents, texts
    at and past the context, empty ones, 1,023 to 1,025 documents, top_n at its edges: a
    200 or a 400 in OpenAI's shape, and the server keeps scoring."""
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=rerank_server.url, timeout=120) as http:

        @settings(max_examples=RERANK_EXAMPLES, deadline=None, database=None,
                  derandomize=True, suppress_health_check=list(HealthCheck))
        @given(rerank_bodies())
        def check(case: tuple[str, Any]) -> None:
            r = post(http, case)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            check_error_shape(r)

        check()
        # how many draws are valid depends on the literals Hypothesis picked up from the
        # modules loaded before; the known-valid bodies below exercise the 200s for sure
        assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 5, statuses
        assert http.get("/healthz").status_code == 200
        for model in RERANKERS:
            r = http.post("/v1/rerank", json={"model": model, "query": "q",
                                              "documents": ["a", "b"]})
            assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text

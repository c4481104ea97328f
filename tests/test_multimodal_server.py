"""Images, audio and LoRA adapters through a real server on Qwen2.5-Coder-0.5B.

The projector (LLaVA-style vision + Ultravox audio) and the adapters are random-weight
GGUFs from tests/make_test_models.py: they test the plumbing (mtmd, the adapter API, the
engine's batches and caches), not what a model sees. Every image here becomes 4 image
tokens; one second of audio becomes 375 audio tokens (Ultravox pads to 30 s).
Clients: the OpenAI SDK (chat, Responses over HTTP and WebSocket), the anthropic SDK.
Media come as data: URLs, from a local HTTP server (its address allowed by config:
``allowed_private_media_networks``), from files under ``allowed_local_media_path``.
"""

from __future__ import annotations

import base64
import io
import json
import math
import random
import struct
import threading
import time
import wave
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from make_test_models import read_base_model, write_lora_adapter, write_projector
from openai import BadRequestError, OpenAI

from conftest import ServerProcess, qwen_config, require_model, same_greedy_text, start_server

IMAGE_TOKENS = 4
AUDIO_TOKENS = 375


def png(seed: int, w: int = 40, h: int = 48) -> bytes:
    rnd = random.Random(seed)
    raw = b"".join(b"\x00" + bytes(rnd.randrange(256) for _ in range(3 * w)) for _ in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def wav(seconds: float = 1.0, hz: float = 440.0) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i * hz * 2 * math.pi
                                                                      / 16000)))
                               for i in range(int(16000 * seconds))))
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# -- a local media server -----------------------------------------------------------------


class MediaHandler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, Any]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        route = self.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        route(self)


def serve_bytes(data: bytes, ctype: str = "image/png") -> Any:
    def handler(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return handler


def redirect(location: str) -> Any:
    def handler(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.end_headers()
    return handler


def trickle(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "image/png")
    h.end_headers()
    data = png(5)
    try:
        for i in range(0, len(data), 16):
            h.wfile.write(data[i:i + 16])
            h.wfile.flush()
            time.sleep(0.5)
    except OSError:
        pass


@pytest.fixture(scope="module")
def media_host() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), MediaHandler)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    MediaHandler.routes = {
        "/cat.png": serve_bytes(png(1)),
        "/dog.png": serve_bytes(png(2)),
        "/page.html": serve_bytes(b"<!doctype html><html><body>hi</body></html>", "text/html"),
        "/big.png": serve_bytes(png(3, 400, 400)),  # ~480 kB, over image_max_bytes
        "/slow.png": trickle,
        "/to-private": redirect(f"http://127.0.0.2:{httpd.server_address[1]}/cat.png"),
        "/to-cat": redirect("/cat.png"),
    }
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield base
    httpd.shutdown()


# -- the server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mm-models")
    base = read_base_model(require_model("qwen-0.5b"))
    media_root = out / "media"
    media_root.mkdir()
    (media_root / "cat.png").write_bytes(png(1))
    outside = out / "secret.png"
    outside.write_bytes(png(7))
    (media_root / "link.png").symlink_to(outside)
    return {"mmproj": write_projector(out / "mmproj.gguf", base.n_embd, vision=True, audio=True),
            "mmproj_narrow": write_projector(out / "mmproj-512.gguf", 512),
            "lora_a": write_lora_adapter(out / "style-a.gguf", base, seed=1, b_scale=0.03),
            "lora_b": write_lora_adapter(out / "style-b.gguf", base, seed=2, b_scale=0.03),
            "media_root": media_root, "outside": outside, "cache": out / "cache"}


def mm_config(files: dict[str, Path]) -> dict[str, Any]:
    cfg = qwen_config(
        n_seq_max=8, n_ctx=8192, mtmd={
            "mmproj_path": str(files["mmproj"]),
            "embedding_cache": {"path": str(files["cache"] / "media")},
            "image_max_bytes": 200_000, "image_timeout_seconds": 2.0,
            "allowed_private_media_networks": ["127.0.0.1/32"],
            "allowed_local_media_path": str(files["media_root"])},
        loras=[{"path": str(files["lora_a"]), "scale": 0.0},
               {"path": str(files["lora_b"]), "scale": 0.0}])
    cfg["disk_cache"] = {"path": str(files["cache"] / "seq"), "min_tokens": 16}
    return cfg


@pytest.fixture(scope="module")
def server(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    s = start_server(mm_config(files), tmp_path_factory.mktemp("mm"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def ask(client: OpenAI, *parts: dict[str, Any], text: str = "Describe this.",
        max_tokens: int = 4, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="qwen", temperature=0, max_tokens=max_tokens, extra_body=extra or None,
        messages=[{"role": "user", "content": [{"type": "text", "text": text}, *parts]}])


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def cached(r: Any) -> int:
    return int(r.usage.prompt_tokens_details.cached_tokens or 0)


def healthy(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


# -- images -------------------------------------------------------------------------------


def test_image_tokens_count_in_usage(client: OpenAI) -> None:
    text_only = ask(client, {"type": "text", "text": ""}, text="Tokens, please.")
    one = ask(client, image(data_url(png(10))), text="Tokens, please.")
    two = ask(client, image(data_url(png(11))), image(data_url(png(12))), text="Tokens, please.")
    assert one.usage.prompt_tokens == text_only.usage.prompt_tokens + IMAGE_TOKENS
    assert two.usage.prompt_tokens == one.usage.prompt_tokens + IMAGE_TOKENS  # no "\n" by images
    assert one.choices[0].finish_reason in ("stop", "length")


def test_same_image_hits_the_prefix_cache_another_does_not(client: OpenAI) -> None:
    first = ask(client, image(data_url(png(20))), text="Cache me: what is this?")
    again = ask(client, image(data_url(png(20))), text="Cache me: what is this?")
    other = ask(client, image(data_url(png(21))), text="Cache me: what is this?")
    n = first.usage.prompt_tokens
    assert cached(again) == n - 1  # everything but the last token: the image included
    # the other image shares the text before it, never the image itself
    assert cached(other) <= n - IMAGE_TOKENS - 5 and other.usage.prompt_tokens == n


def test_follow_up_turn_does_not_re_encode_the_image(client: OpenAI,
                                                     server: ServerProcess) -> None:
    msgs: list[Any] = [{"role": "user", "content": [
        {"type": "text", "text": "Remember this picture."}, image(data_url(png(30)))]}]
    first = client.chat.completions.create(model="qwen", temperature=0, max_tokens=6,
                                           messages=msgs)
    encodes = server.metrics()["llamaserve_media_encode_seconds_count"]
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And now, in one word?"}]
    follow = client.chat.completions.create(model="qwen", temperature=0, max_tokens=4,
                                            messages=msgs)
    assert cached(follow) >= first.usage.prompt_tokens
    assert server.metrics()["llamaserve_media_encode_seconds_count"] == encodes


def test_http_url_and_redirects_from_an_allowed_network(client: OpenAI, media_host: str) -> None:
    by_url = ask(client, image(f"{media_host}/cat.png"), text="Fetched:")
    by_data = ask(client, image(data_url(png(1))), text="Fetched:")
    assert by_url.usage.prompt_tokens == by_data.usage.prompt_tokens
    assert cached(by_data) == by_data.usage.prompt_tokens - 1  # the same bytes: same image
    redirected = ask(client, image(f"{media_host}/to-cat"), text="Fetched:")
    assert cached(redirected) == redirected.usage.prompt_tokens - 1


def test_file_url_under_the_allowed_root(client: OpenAI, files: dict[str, Path]) -> None:
    r = ask(client, image((files["media_root"] / "cat.png").as_uri()), text="From disk:")
    assert r.usage.prompt_tokens > IMAGE_TOKENS


def refusal_cases(media_host: str, files: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(id, url, what the message must mention)."""
    port = media_host.rsplit(":", 1)[1]
    return [
        ("private-by-default", f"http://127.0.0.2:{port}/cat.png", "127.0.0.2"),
        ("metadata-address", "http://169.254.169.254/latest/meta-data", "169.254.169.254"),
        ("ipv6-loopback", f"http://[::1]:{port}/cat.png", ""),
        ("mapped-ipv6", f"http://[::ffff:10.0.0.1]:{port}/cat.png", ""),
        ("redirect-to-private", f"{media_host}/to-private", "127.0.0.2"),
        ("oversize", f"{media_host}/big.png", ""),
        ("slow-server", f"{media_host}/slow.png", ""),
        ("not-an-image", f"{media_host}/page.html", ""),
        ("http-404", f"{media_host}/missing.png", "404"),
        ("file-outside-root", files["outside"].as_uri(), ""),
        ("file-through-symlink", (files["media_root"] / "link.png").as_uri(), ""),
        ("file-dotdot", (files["media_root"]).as_uri() + "/../secret.png", ""),
        ("unknown-scheme", "ftp://example.com/cat.png", "ftp"),
        ("javascript", "javascript:alert(1)", ""),
        ("broken-png", data_url(png(1)[:60] + b"\x00" * 200), ""),
        ("bad-base64", "data:image/png;base64,%%%not-base64", ""),
        ("empty", "", ""),
    ]


def test_every_refusal_is_a_400_naming_the_part(client: OpenAI, server: ServerProcess,
                                                media_host: str, files: dict[str, Path]) -> None:
    for name, url, mention in refusal_cases(media_host, files):
        started = time.monotonic()
        with pytest.raises(BadRequestError) as err:
            ask(client, {"type": "text", "text": "x"}, image(url))
            pytest.fail(f"{name}: accepted")
        body = err.value.body
        assert isinstance(body, dict), name
        param = str(body.get("param"))
        assert param.startswith("messages[0].content[2]"), (name, body)
        assert mention in str(body.get("message")), (name, body)
        assert time.monotonic() - started < 6, name  # the slow server is cut at 2 s
    healthy(server)
    assert ask(client, image(data_url(png(1)))).usage.prompt_tokens > 0  # still serving


def test_concurrent_images_and_text_streams_all_complete(client: OpenAI) -> None:
    def image_request(i: int) -> int:
        r = ask(client, image(data_url(png(100 + i))), text=f"Image number {i}:", max_tokens=8)
        return int(r.usage.prompt_tokens)

    def text_stream(i: int) -> str:
        stream = client.chat.completions.create(
            model="qwen", temperature=0, max_tokens=24, stream=True,
            messages=[{"role": "user", "content": f"Count from {i} upwards."}])
        chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
        return "".join(chunks)

    with ThreadPoolExecutor(8) as pool:
        images = [pool.submit(image_request, i) for i in range(4)]
        texts = [pool.submit(text_stream, i) for i in range(4)]
        assert len({f.result(timeout=300) for f in images}) == 1  # same length prompts
        assert all(f.result(timeout=300) for f in texts)


# -- audio -----------------------------------------------------------------------------------


def test_audio_part_counts_its_tokens(client: OpenAI) -> None:
    clip = base64.b64encode(wav()).decode()
    with_audio = ask(client, {"type": "input_audio",
                              "input_audio": {"data": clip, "format": "wav"}}, text="Hear:")
    without = ask(client, {"type": "text", "text": ""}, text="Hear:")
    assert with_audio.usage.prompt_tokens == without.usage.prompt_tokens + AUDIO_TOKENS
    with pytest.raises(BadRequestError) as err:  # a PNG is not audio
        ask(client, {"type": "input_audio", "input_audio": {
            "data": base64.b64encode(png(1)).decode(), "format": "wav"}})
    assert "input_audio" in str(err.value.body.get("param"))  # type: ignore[union-attr]


def test_vision_only_projector_refuses_audio_with_a_clear_400(
        files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    base = read_base_model(require_model("qwen-0.5b"))
    out = tmp_path_factory.mktemp("vision-only")
    cfg = qwen_config(n_seq_max=2, mtmd={"mmproj_path": str(write_projector(
        out / "v.gguf", base.n_embd))})
    s = start_server(cfg, out)
    try:
        c = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
        with pytest.raises(BadRequestError) as err:
            ask(c, {"type": "input_audio", "input_audio": {
                "data": base64.b64encode(wav(0.2)).decode(), "format": "wav"}})
        assert "does not read audio" in str(err.value)
        assert ask(c, image(data_url(png(1)))).usage.prompt_tokens > IMAGE_TOKENS
    finally:
        s.stop()


def test_projector_of_the_wrong_width_is_refused_at_start(
        files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("narrow")
    cfg = qwen_config(mtmd={"mmproj_path": str(files["mmproj_narrow"])})
    s = start_server(cfg, out, wait=False)
    assert s.proc.wait(120) == 1
    log = s.log()
    assert "model.mtmd" in log and "n_embd" in log, log[-2000:]


# -- other APIs --------------------------------------------------------------------------------


def test_responses_input_image_over_http_and_websocket(client: OpenAI,
                                                       server: ServerProcess) -> None:
    content = [{"type": "input_text", "text": "Responses sees:"},
               {"type": "input_image", "image_url": data_url(png(40)), "detail": "auto"}]
    r = client.responses.create(model="qwen", temperature=0, max_output_tokens=4,
                                input=[{"role": "user", "content": content}])  # type: ignore
    assert r.status in ("completed", "incomplete") and r.usage is not None
    chat = ask(client, image(data_url(png(40))), text="Responses sees:")
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "qwen", "temperature": 0,
                            "max_output_tokens": 4,
                            "input": [{"role": "user", "content": content}]}))
        while True:
            event = json.loads(ws.recv(timeout=120))
            if event["type"] in ("response.completed", "response.incomplete", "error",
                                 "response.failed"):
                break
    assert event["type"] != "error", event
    assert event["response"]["usage"]["input_tokens"] == chat.usage.prompt_tokens
    bad = [{"type": "input_text", "text": "x"},
           {"type": "input_image", "image_url": "ftp://example.com/x.png"}]
    with pytest.raises(BadRequestError) as err:
        client.responses.create(model="qwen", max_output_tokens=2,
                                input=[{"role": "user", "content": bad}])  # type: ignore
    assert str(err.value.body.get("param")).startswith("input[0].content[1]")  # type: ignore


def test_anthropic_image_block(server: ServerProcess) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    msg = c.messages.create(model="qwen", max_tokens=4, extra_body={"temperature": 0},
                            messages=[{"role": "user", "content": [
                                {"type": "text", "text": "Anthropic sees:"},
                                {"type": "image", "source": {
                                    "type": "base64", "media_type": "image/png",
                                    "data": base64.b64encode(png(50)).decode()}}]}])
    plain = c.messages.create(model="qwen", max_tokens=4, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": [
                                  {"type": "text", "text": "Anthropic sees:"},
                                  {"type": "text", "text": ""}]}])
    def total(u: Any) -> int:  # Anthropic counts cache reads apart from input_tokens
        return int(u.input_tokens + (u.cache_read_input_tokens or 0))
    assert total(msg.usage) == total(plain.usage) + IMAGE_TOKENS


# -- LoRA ----------------------------------------------------------------------------------------

CODE = "def fibonacci(n):"


def complete(client: OpenAI, **extra: Any) -> str:
    r = client.completions.create(model=extra.pop("model", "qwen"), prompt=CODE,
                                  temperature=0, max_tokens=12, extra_body=extra or None)
    return r.choices[0].text


def test_models_lists_the_adapters(client: OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == ["qwen2.5-coder-0.5b-instruct", "style-a", "style-b"]


def test_adapter_scale_zero_is_the_base_model_and_one_differs(client: OpenAI) -> None:
    base = complete(client)
    assert complete(client, lora=[{"name": "style-a", "scale": 0.0}]) == base
    with_a = complete(client, lora=[{"name": "style-a", "scale": 1.0}])
    assert with_a != base
    assert complete(client, model="style-a") == with_a  # the model field names it
    assert complete(client, lora=[{"id": 0, "scale": 1.0}]) == with_a
    with_b = complete(client, lora=[{"id": 1, "scale": 3.0}])
    assert with_b not in (base, with_a)
    both = complete(client, lora=[{"id": 0, "scale": 1.0}, {"name": "style-b", "scale": 3.0}])
    assert both not in (base, with_a, with_b)
    for bad, param in (([{"name": "nope"}], "lora[0].name"), ([{"id": 9}], "lora[0].id"),
                       ([{"name": "style-a", "scale": "x"}], "lora[0].scale"),
                       ({"name": "style-a"}, "lora")):
        with pytest.raises(BadRequestError) as err:
            complete(client, lora=bad)
        assert err.value.body.get("param") == param  # type: ignore[union-attr]


def test_concurrent_requests_with_and_without_an_adapter_match_their_solo_runs(
        client: OpenAI) -> None:
    """Equal to the solo run up to a near-tie: sequences decoded together go through other
    matmul kernels than one alone (conftest.same_greedy_text)."""
    solo = {}
    for name in ("", "style-a", "style-b"):
        r = client.completions.create(model="qwen", prompt=CODE, temperature=0, max_tokens=12,
                                      logprobs=5, extra_body={"lora": [
                                          {"name": name, "scale": 1.0}] if name else []})
        lp = r.choices[0].logprobs
        assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
        solo[name] = (lp.tokens, lp.top_logprobs)
    with ThreadPoolExecutor(6) as pool:
        futures = [(name, pool.submit(complete, client, lora=[{"name": name, "scale": 1.0}]
                                      if name else []))
                   for name in ("", "style-a", "style-b") * 2]
        for name, f in futures:
            text = f.result(timeout=300)
            assert same_greedy_text(text, *solo[name]), (name, text, "".join(solo[name][0]))


def test_prefix_cache_entries_never_cross_adapter_sets(client: OpenAI) -> None:
    words = " ".join(f"rule {i}: answer briefly about item {i * 7 % 97}." for i in range(60))

    def run(lora: list[dict[str, Any]]) -> Any:
        return client.chat.completions.create(
            model="qwen", temperature=0, max_tokens=2, extra_body={"lora": lora},
            messages=[{"role": "system", "content": words},
                      {"role": "user", "content": "Adapter cache check."}])

    base = run([])
    assert cached(run([{"name": "style-a", "scale": 1.0}])) == 0
    assert cached(run([{"name": "style-a", "scale": 0.5}])) == 0  # another scale: another set
    assert cached(run([{"name": "style-a", "scale": 1.0}])) == base.usage.prompt_tokens - 1
    assert cached(run([])) == base.usage.prompt_tokens - 1


# -- restart -----------------------------------------------------------------------------------


def test_restart_hits_the_disk_caches(files: dict[str, Path], server: ServerProcess,
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """Runs last in this module: it restarts the server on the same cache directories."""
    c = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    long_text = "Describe precisely, " + "with care and detail, " * 12
    first = ask(c, image(data_url(png(60))), text=long_text)
    server.stop()
    time.sleep(0.5)  # the disk writers finished on shutdown
    assert list((files["cache"] / "media").glob("*.embd"))
    again = start_server(mm_config(files), tmp_path_factory.mktemp("mm-restart"))
    try:
        c2 = OpenAI(base_url=again.base_url, api_key="x", max_retries=0)
        r = ask(c2, image(data_url(png(60))), text=long_text)
        assert cached(r) == first.usage.prompt_tokens - 1  # the sequence came from disk
        # the same image under new text: the prefix ends before it, its embeddings don't
        other = ask(c2, image(data_url(png(60))), text="Something else entirely:")
        assert cached(other) < other.usage.prompt_tokens - IMAGE_TOKENS
        metrics = again.metrics()
        assert metrics["llamaserve_media_cache_hits_total"] >= 1
        assert metrics.get("llamaserve_media_encode_seconds_count", 0) == 0
    finally:
        again.stop()


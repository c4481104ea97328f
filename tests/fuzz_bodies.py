"""Hypothesis strategies for request bodies: near-valid requests with fields of the wrong
type, out of range, unknown, or missing, for every endpoint (Ollama's /api routes too);
images, audio and LoRA adapters through their real paths (``fuzz_config``: a projector,
two adapters and a media root on Gemma 3 270M). Shared by the short CI fuzz
(tests/test_fuzz.py) and the long one (bench/fuzz.py)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import strategies as st

import media_samples as samples

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)

TEXT = st.text(max_size=40)

# -- media and LoRA: the fuzz server's projector, adapters and media root -------------------

LORA_NAMES = ("style-a", "style-b")
MEDIA_MAX_BYTES = 32 * 1024  # under max_body_bytes (64 KiB): "too large" is reachable
MEDIA_MAX_PIXELS = 2048 * 2048
MEDIA_MAX_SECONDS = 60.0
MEDIA_ROOT = "/nonexistent-llamaserve-fuzz-media"  # fuzz_config points it at a real directory


def fuzz_config(tmp: Path) -> dict[str, Any]:
    """The fuzz server: Gemma 3 270M with a chat template (chat, Responses and Anthropic
    bodies run all the way through), 4 sequences, 64 KiB bodies, a vision + audio projector
    and two LoRA adapters written for Gemma's width into ``tmp``, small media limits, no
    private addresses (every generated URL is refused before any connection) and a media
    root for file: URLs (sets ``MEDIA_ROOT``)."""
    global MEDIA_ROOT
    from make_test_models import read_base_model, write_lora_adapter, write_projector

    from conftest import gemma_config, require_model

    base = read_base_model(require_model("gemma"))
    models = tmp / "models"
    models.mkdir(parents=True, exist_ok=True)
    mmproj = write_projector(models / "mmproj.gguf", base.n_embd, vision=True, audio=True)
    loras = [{"path": str(write_lora_adapter(models / f"{name}.gguf", base, seed=i + 1)),
              "name": name, "scale": 0.0} for i, name in enumerate(LORA_NAMES)]
    root = tmp / "media"
    (root / "sub").mkdir(parents=True, exist_ok=True)
    (root / "ok.png").write_bytes(samples.png(3, 2))
    (root / "sound.wav").write_bytes(samples.wav())
    (root / "big.png").write_bytes(samples.png() + bytes(MEDIA_MAX_BYTES))
    (root / "bomb.gif").write_bytes(samples.gif_claiming(65535, 65535))
    (root / "page.png").write_bytes(b"<!doctype html><html></html>")
    for name, target in (("escape.png", "/etc/passwd"), ("zero.png", "/dev/zero")):
        if not (root / name).is_symlink():
            (root / name).symlink_to(target)
    if not (root / "fifo.png").exists():
        os.mkfifo(root / "fifo.png")
    MEDIA_ROOT = str(root.resolve())
    cfg = gemma_config(max_output_tokens=4, n_seq_max=4, embedding=True, chat_template=CHATML,
                       mtmd={"mmproj_path": str(mmproj), "image_max_bytes": MEDIA_MAX_BYTES,
                             "audio_max_bytes": MEDIA_MAX_BYTES, "image_timeout_seconds": 1,
                             "max_media_per_request": 4, "image_max_pixels": MEDIA_MAX_PIXELS,
                             "audio_max_seconds": MEDIA_MAX_SECONDS,
                             "allowed_local_media_path": MEDIA_ROOT},
                       loras=loras)
    cfg["server"]["max_body_bytes"] = 65536
    cfg["server"]["responses_store_path"] = str(tmp / "responses")  # the shared-store code
    return cfg


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


VALID_IMAGES = [samples.png(), samples.png(3, 5), samples.GIF, samples.bmp(), samples.jpeg()]
VALID_AUDIO = [samples.wav(), samples.mp3()]
# valid magic, hostile header or body: each refused from its header, or decoded within the
# limits (the last pixel / second under them included)
HOSTILE_IMAGES = [
    samples.png_claiming(65535, 65535), samples.png_claiming(2**31, 2**31),
    samples.png_claiming(2049, 2048), samples.png_claiming(0, 5), samples.png_claiming(1, 1),
    samples.png_bomb(2048, 2048), samples.png_bomb(4096, 4096),
    samples.gif_claiming(65535, 65535), samples.gif_claiming(2048, 2048),
    samples.gif_claiming(0, 0), samples.bmp_claiming(65535, 65535),
    samples.bmp_claiming(2048, -2048), samples.bmp_claiming(-1, 1),
    samples.bmp_claiming(7, 7, bits=0), samples.bmp_claiming(7, 7, bits=33),
    samples.jpeg_claiming(65535, 65535), samples.jpeg_claiming(1024, 1024),
    samples.jpeg_claiming(0, 0), samples.jpeg_claiming(256, 256, scans=150),
    samples.jpeg_claiming(512, 512, scans=100), samples.png_interlaced(37, 23),
    samples.png_claiming(16, 16, samples.zeros_zlib(3_000_000)),
    samples.png()[:40] + b"garbage" * 9, b"GIF89a" + bytes(20),
    b"BM" + bytes(12) + b"\x28" + bytes(40), samples.webp(), b"\xff\xd8\xff\xe0" + bytes(60),
]
HOSTILE_AUDIO = [
    samples.wav_claiming(), samples.wav_claiming(channels=0), samples.wav_claiming(rate=0),
    samples.wav_claiming(rate=1, bits=8), samples.wav_claiming(rate=1, bits=8, payload=bytes(59)),
    samples.wav_claiming(fmt_tag=3, bits=32), samples.wav_claiming(fmt_tag=2, bits=4),
    samples.wav_claiming(bits=0), samples.wav_claiming(channels=65535),
    samples.wav_claiming(rate=2**32 - 1), samples.flac_claiming(),
    samples.flac_claiming(rate=16000, total_samples=16000 * 61), samples.flac(),
    b"RIFF\xff\xff\xff\xffWAVE" + bytes(40), b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(30),
    b"fLaC" + bytes(30), samples.MP3_FRAME[:4] + b"\xff" * 40,
    samples.ID3_EMPTY + samples.flac_claiming(), samples.ID3_EMPTY + b"OggS" + bytes(30),
    samples.mp3_xing(1_000_000), samples.mp3_xing(1000), samples.mp3_xing(2**32 - 1),
    samples.mp3() + b"Info" * 70, b"\xff\xf3\x00\xc0" * 1000,  # free-format 4-byte frames
]
MEDIA_BYTES = st.one_of(
    st.sampled_from(VALID_IMAGES), st.sampled_from(HOSTILE_IMAGES),
    st.sampled_from(HOSTILE_AUDIO),
    st.sampled_from(VALID_AUDIO),
    # a valid sample cut short, or with bytes overwritten after the magic
    st.builds(lambda d, at: d[:at], st.sampled_from(VALID_IMAGES + VALID_AUDIO),
              st.integers(0, 60)),
    st.builds(lambda d, at, junk: d[:at] + junk + d[at + len(junk):],
              st.sampled_from(VALID_IMAGES + VALID_AUDIO), st.integers(8, 60),
              st.binary(min_size=1, max_size=8)),
    st.binary(max_size=40))
MIMES = st.sampled_from(["image/png", "image/jpeg", "audio/wav", "", "text/html",
                         "image/png;charset=utf-8", "x/y,z", "image/svg+xml"])


@st.composite
def base64_payloads(draw: st.DrawFn) -> str:
    """Base64 of media bytes, damaged or not: padding left out, line breaks, characters
    outside the alphabet, a data: URL where bare base64 goes, or too long."""
    text = _b64(draw(MEDIA_BYTES))
    how = draw(st.sampled_from(["plain", "unpadded", "lines", "junk", "data_url", "one_extra",
                                "huge", "plain"]))  # the ends come up most
    if how == "unpadded":
        return text.rstrip("=")
    if how == "lines":
        return "\r\n".join(text[i:i + 60] for i in range(0, len(text), 60))
    if how == "junk":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.sampled_from(["!", "%", "=", " ", "\u00e9", "-_"])) + text[at:]
    if how == "data_url":
        return f"data:{draw(MIMES)};base64,{text}"
    if how == "one_extra":
        return text + "A"
    return "A" * draw(st.sampled_from([43_700, 44_000, 60_000]))  # about the 32 KiB limit


@st.composite
def data_urls(draw: st.DrawFn) -> str:
    data = draw(MEDIA_BYTES)
    mime = draw(MIMES)
    how = draw(st.sampled_from(["base64", "percent", "pct_base64", "no_comma", "bad_percent",
                                "surrogate", "huge_plain", "upper", "base64"]))
    if how == "base64":
        return f"data:{mime};base64,{draw(base64_payloads())}"
    if how == "percent":
        return f"data:{mime}," + quote(data)
    if how == "pct_base64":
        return f"data:{mime};base64," + _b64(data).replace("+", "%2B").replace("/", "%2F")
    if how == "no_comma":
        return f"data:{mime};base64{_b64(data)}"
    if how == "bad_percent":
        return f"data:{mime}," + quote(data) + draw(st.sampled_from(["%", "%z", "%zz", "%f"]))
    if how == "surrogate":  # the body decoder refuses it before any media code
        return f"data:{mime};base64,{_b64(data)}" + draw(st.sampled_from(["\ud800", "\udfff"]))
    if how == "huge_plain":
        return f"data:{mime}," + "x" * draw(st.sampled_from([33_000, 60_000]))
    return f"DATA:{mime.upper()};BASE64,{_b64(data)}"


# hosts that never leave the machine: literals of private / reserved / loopback addresses
# (refused before connecting), names that resolve locally, and .invalid (never resolves)
HOSTS = [
    "127.0.0.1", "127.0.0.2", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1",
    "169.254.169.254", "0.0.0.0", "0", "255.255.255.255", "224.0.0.1", "192.0.2.1",
    "[::1]", "[::]", "[::ffff:127.0.0.1]", "[::ffff:169.254.169.254]", "[fd00::1]",
    "[fe80::1%25eth0]", "[64:ff9b::a00:1]", "[2002:7f00:1::]", "[::1", "[not:an:ip]",
    "localhost", "LOCALHOST", "localhost.", "example.invalid", "a.b.c.example.invalid",
    # numeric spellings of 127.0.0.1 / 10.0.0.1 the resolver reads (inet_aton)
    "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1", "167772161", "012.0.0.1",
    # unicode / IDNA: spoofs of localhost and dots, junk labels
    "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54", "127\u30020\u30020\u30021",
    "ex\u00e4mple.invalid", "\u2603.invalid", "xn--.invalid", "xn--zz.invalid",
    "a" * 64 + ".invalid", ("a" * 63 + ".") * 4 + "invalid", "a..b.invalid", "-a.invalid",
    "ex ample.invalid", "exa%6dple.invalid", "\u0130.invalid", "\u200b.invalid", "",
    # userinfo
    "user:pass@example.invalid", "127.0.0.1@example.invalid", "example.invalid@127.0.0.1",
    "@example.invalid", "a@b@example.invalid",
]
PORTS = ["", ":80", ":0", ":1", ":65535", ":65536", ":99999", ":-1", ":1e3", ":",
         ":\uff18\uff10", ":8080:80", ":" + "9" * 30]
PATHS = ["/x.png", "/", "", "/a%00b.png", "/..%2f..%2fetc%2fpasswd", "/x.png?q=1#f",
         "/\u00e9.png", "/" + "a" * 8200, "/%zz", "\\x.png"]


@st.composite
def http_urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "hTTps"]))
    return (f"{scheme}://{draw(st.sampled_from(HOSTS))}{draw(st.sampled_from(PORTS))}"
            f"{draw(st.sampled_from(PATHS))}")


FILE_PATHS = ["/ok.png", "/sound.wav", "/big.png", "/bomb.gif", "/page.png", "/escape.png",
              "/zero.png", "/fifo.png", "/sub", "/sub/", "/missing.png", "/../../etc/passwd",
              "/%2e%2e/%2e%2e/etc/passwd", "/ok.png%00.txt", "/ok.png?x=1", "/ok.png#f",
              "/./ok.png", "//ok.png", "/ok%2Epng", "/" + "a" * 300]


@st.composite
def file_urls(draw: st.DrawFn) -> str:
    """file: URLs inside the fuzz server's media root (some escaping it) and outside."""
    path = draw(st.sampled_from(FILE_PATHS))
    form = draw(st.sampled_from(["file://", "file:", "file://localhost",
                                 "file://example.invalid", "FILE://", "file://"]))
    if draw(st.integers(0, 4)) == 0:
        return form + draw(st.sampled_from(["/etc/passwd", "/dev/zero", "/proc/self/mem",
                                            "/", "", "ok.png", "/etc/../etc/passwd"]))
    return form + quote(MEDIA_ROOT) + path


OTHER_URLS = st.sampled_from([
    "ftp://example.invalid/x.png", "gopher://127.0.0.1:70/", "javascript:alert(1)",
    "about:blank", "blob:http://example.invalid/1", "C:\\img.png", "//example.invalid/x.png",
    "/etc/passwd", "", " ", "data", "http:", "http://", "https://[", "ws://127.0.0.1/",
    "x" * 70, _b64(samples.png()), "data:,", "data:", "mailto:a@example.invalid",
    "http://example.invalid/" + "a" * 20_000])
MEDIA_URL = st.one_of(data_urls(), http_urls(), file_urls(), OTHER_URLS)
NOT_A_URL = st.one_of(JSON, st.fixed_dictionaries({"url": MEDIA_URL}),
                      st.lists(MEDIA_URL, min_size=1, max_size=2))
DETAIL = st.sampled_from(["auto", "low", "high", "x", ""]) | JSON


def _pick(draw: st.DrawFn, weights: dict[str, int]) -> str:
    """One of the keys, as often as its weight (hypothesis's ``one_of`` favours its first
    branches and optional keys' absence; a short run needs every class)."""
    return draw(st.sampled_from([k for k, n in weights.items() for _ in range(n)]))


@st.composite
def url_objects(draw: st.DrawFn) -> Any:
    """``{"url": ..., "detail"?: ...}`` mostly; a bare string where the object goes, junk,
    or no url."""
    how = _pick(draw, {"object": 6, "bare": 1, "junk": 1, "no_url": 1})
    if how == "object":
        obj: dict[str, Any] = {"url": draw(MEDIA_URL)}
        if draw(st.integers(0, 3)) == 0:
            obj["detail"] = draw(DETAIL)
        return obj
    if how == "bare":
        return draw(MEDIA_URL)
    if how == "junk":
        return draw(NOT_A_URL)
    return {"detail": draw(DETAIL)}


AUDIO_FORMATS = st.sampled_from(["wav", "mp3", "flac", "ogg", "", "WAV"]) | JSON


@st.composite
def audio_objects(draw: st.DrawFn) -> Any:
    """``input_audio``: base64 ``data`` and maybe a ``format``, or junk."""
    how = _pick(draw, {"data": 6, "junk_data": 1, "junk": 1})
    if how == "junk":
        return draw(JSON)
    obj = {"data": draw(base64_payloads() if how == "data" else JSON)}
    if draw(st.booleans()):
        obj["format"] = draw(AUDIO_FORMATS)
    return obj


@st.composite
def chat_media_parts(draw: st.DrawFn) -> dict[str, Any]:
    how = _pick(draw, {"image_url": 6, "input_audio": 2, "audio_url": 2, "input_image": 1,
                       "file": 1, "type_only": 1})
    if how in ("image_url", "audio_url"):
        return {"type": how, how: draw(url_objects())}
    if how == "input_audio":
        return {"type": how, "input_audio": draw(audio_objects())}
    if how == "input_image":  # a Responses part in chat
        return {"type": how, "image_url": draw(MEDIA_URL)}
    if how == "file":
        return {"type": draw(st.sampled_from(["file", "input_file"])), "file": draw(JSON)}
    return {"type": draw(st.sampled_from(["image_url", "input_audio", "audio_url"]))}


@st.composite
def responses_media_parts(draw: st.DrawFn) -> dict[str, Any]:
    how = _pick(draw, {"url": 6, "junk_url": 1, "file_id": 1, "input_audio": 3, "other": 1})
    if how == "input_audio":
        return {"type": how, "input_audio": draw(audio_objects())}
    if how == "other":
        return {"type": draw(st.sampled_from(["input_file", "image_url"])),
                "image_url": draw(url_objects()), "file_data": draw(JSON)}
    part: dict[str, Any] = {"type": "input_image"}
    if how == "url":
        part["image_url"] = draw(MEDIA_URL)
    elif how == "junk_url":
        part["image_url"] = draw(NOT_A_URL)
    else:
        part["file_id"] = draw(st.sampled_from(["file-1", ""]) | JSON)
    if draw(st.integers(0, 3)) == 0:
        part["detail"] = draw(DETAIL)
    return part


MEDIA_TYPES = st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp",
                               "audio/wav", "", "x/y,z", "image/png;base64"]) | JSON


@st.composite
def anthropic_images(draw: st.DrawFn) -> dict[str, Any]:
    """An image block: a base64 or url source (fields missing or junk now and then)."""
    how = _pick(draw, {"base64": 5, "url": 3, "other_source": 1, "no_source": 1, "junk": 1})
    if how == "no_source":
        return {"type": "image"}
    if how == "junk":
        return {"type": "image", "source": draw(JSON)}
    if how == "other_source":
        return {"type": "image", "source": {"type": draw(st.sampled_from(["file", "x"])),
                                            "file_id": draw(TEXT)}}
    if how == "url":
        source: dict[str, Any] = {"type": "url", "url": draw(MEDIA_URL)}
    else:
        source = {"type": "base64", "media_type": draw(MEDIA_TYPES),
                  "data": draw(base64_payloads())}
    if draw(st.integers(0, 5)) == 0:  # a field missing or of the wrong type
        key = draw(st.sampled_from(sorted(source)))
        if draw(st.booleans()):
            del source[key]
        else:
            source[key] = draw(JSON)
    return {"type": "image", "source": source}


CHAT_MEDIA_PART = chat_media_parts()
RESPONSES_MEDIA_PART = responses_media_parts()
ANTHROPIC_IMAGE = anthropic_images()
TEXT_PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]),
                                   "text": TEXT})

# many parts: past max_media_per_request (4) with valid tiny images, or exactly at it
_TINY = "data:image/png;base64," + _b64(samples.png())
MANY_MEDIA = st.integers(3, 8).map(
    lambda n: [{"type": "text", "text": "Look:"}]
    + [{"type": "image_url", "image_url": {"url": _TINY}}] * n)

LORA_IDS = st.integers(-2, 3) | st.sampled_from([True, False, "0", 0.0, 1.0, 2**63, -2**63])
LORA_REFS = st.sampled_from([*LORA_NAMES, "STYLE-A", "style-c", "", "gemma-3-270m",
                             "style-a ", "style-a.gguf"])
LORA_SCALES = st.floats(-150, 150, allow_nan=False) | st.sampled_from([
    0, 1, -1, 100, -100, 100.0000001, 1e308, -1e308, 5e-324, 2**64, "1", "NaN", "Infinity",
    "-1e999", True, False, None])


@st.composite
def lora_entries(draw: st.DrawFn) -> Any:
    """One ``lora`` entry: by id or name (known or not), with a scale (in range or not,
    of the wrong type), both, neither, or not an object."""
    how = _pick(draw, {"id": 4, "name": 4, "both": 1, "neither": 1, "junk": 1})
    if how == "junk":
        return draw(JSON)
    entry: dict[str, Any] = {}
    if how in ("id", "both"):
        entry["id"] = draw(LORA_IDS | JSON) if draw(st.integers(0, 5)) == 0 else \
            draw(LORA_IDS)
    if how in ("name", "both"):
        entry["name"] = draw(LORA_REFS | JSON) if draw(st.integers(0, 5)) == 0 else \
            draw(LORA_REFS)
    if draw(st.integers(0, 3)) > 0:
        entry["scale"] = draw(LORA_SCALES | JSON) if draw(st.integers(0, 5)) == 0 else \
            draw(LORA_SCALES)
    return entry


LORA_ENTRY = lora_entries()
LORA = st.one_of(
    st.lists(LORA_ENTRY, max_size=3),
    st.lists(LORA_ENTRY, min_size=1, max_size=2).map(lambda x: x * 2),  # duplicates
    st.sampled_from([[{}] * 10_000, [0] * 10_000, [{"id": 0, "scale": 0.5}] * 2000,
                     [{"name": "style-a"}, {"id": 0, "scale": -1}], []]),
    JSON)
MODEL = st.sampled_from(["x", "gemma-3-270m", *LORA_NAMES, "Style-A", "style-a ", ""]) | JSON
# in every endpoint's field list: mostly an adapter set the server has (the body can still
# succeed), else any ``lora`` value
VALID_LORA = st.lists(st.fixed_dictionaries({"name": st.sampled_from(LORA_NAMES)}, optional={
    "scale": st.floats(-2, 2, allow_nan=False)}), max_size=2)

MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant",
                                                          "tool", "developer", "robot"]),
                                 "content": TEXT | st.lists(st.fixed_dictionaries({
                                     "type": st.sampled_from(["text", "image_url", "x"]),
                                     "text": TEXT}), max_size=2)
                                 | st.lists(TEXT_PART | CHAT_MEDIA_PART, max_size=5)
                                 | MANY_MEDIA | JSON})
TOOL = st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"]),
                              "function": st.fixed_dictionaries({
                                  "name": st.sampled_from(["f", "get_weather", ""]),
                                  "parameters": st.just({"type": "object", "properties": {
                                      "a": {"type": "integer"}}}) | JSON})})
COMMON: dict[str, Any] = {
    "model": MODEL,
    "lora": VALID_LORA | LORA,
    "max_tokens": st.integers(-5, 6) | JSON,
    "temperature": st.floats(-1, 3, allow_nan=False) | JSON,
    "top_p": st.floats(-1, 2, allow_nan=False) | JSON,
    "top_k": st.integers(-3, 100) | JSON,
    "n": st.integers(-1, 20) | JSON,
    "seed": st.integers(-2**70, 2**70) | JSON,
    "stop": TEXT | st.lists(TEXT, max_size=20) | JSON,
    "logit_bias": st.dictionaries(st.sampled_from(["1", "262144", "-1", "x"]),
                                  st.integers(-200, 200), max_size=3) | JSON,
    "stream": st.booleans() | JSON,
    "logprobs": st.integers(-1, 25) | st.booleans() | JSON,
    "thinking_budget_tokens": st.integers(-2, 2**70) | JSON,
    "unknown_field": JSON,
}
# a chat template for the fuzz server (Gemma 3 270M has none), so chat, Responses and
# Anthropic bodies run all the way through rendering, grammars and generation
CHATML = ("{% for m in messages %}<start>{{ m.role }}\n{{ m.content or '' }}"
          "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}<end>\n{% endfor %}"
          "{% if tools %}{{ tools | tojson }}{% endif %}<start>assistant\n")
BLOCK = st.fixed_dictionaries({
    "type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "x"]),
    "text": TEXT | JSON, "id": TEXT, "tool_use_id": TEXT, "name": TEXT,
    "input": JSON, "content": TEXT | JSON | st.lists(ANTHROPIC_IMAGE, max_size=2),
    "thinking": TEXT})
ANTHROPIC: dict[str, Any] = {
    "model": COMMON["model"], "lora": COMMON["lora"],
    "system": TEXT | st.lists(BLOCK | ANTHROPIC_IMAGE, max_size=2) | JSON,
    "messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant", "x"]),
        "content": TEXT | st.lists(BLOCK | ANTHROPIC_IMAGE, max_size=3) | JSON}), max_size=3)
    | JSON,
    "tools": st.lists(st.fixed_dictionaries({"name": TEXT, "input_schema": JSON}),
                      max_size=2) | JSON,
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(
        ["auto", "any", "tool", "none", "x"]), "name": TEXT}) | JSON,
    "thinking": st.fixed_dictionaries({
        "type": st.sampled_from(["enabled", "disabled", "adaptive", "x"]),
        "budget_tokens": st.integers(-2, 2**70) | JSON}) | JSON,
    "output_config": JSON, "unknown_field": JSON}
ENDPOINTS: dict[str, dict[str, Any]] = {
    "/v1/completions": {**COMMON, "prompt": TEXT | st.lists(TEXT, max_size=3)
                        | st.lists(st.integers(-10, 300000), max_size=5) | JSON,
                        "echo": st.booleans() | JSON, "suffix": TEXT},
    "/v1/chat/completions": {**COMMON, "messages": st.lists(MESSAGE, max_size=3) | JSON,
                             "tools": st.lists(TOOL, max_size=2) | JSON,
                             "tool_choice": st.sampled_from(["auto", "none", "required"])
                             | st.just({"type": "function", "function": {"name": "f"}})
                             | JSON,
                             "response_format": st.sampled_from([
                                 {"type": "json_object"}, {"type": "text"},
                                 {"type": "json_schema", "json_schema": {
                                     "name": "s", "schema": {"type": "object"}}}]) | JSON,
                             "top_logprobs": st.integers(-1, 30) | JSON},
    "/v1/responses": {**COMMON, "input": TEXT | st.lists(st.fixed_dictionaries({
        "type": st.sampled_from(["message", "function_call_output", "reasoning", "x",
                                 "custom_tool_call", "local_shell_call", "web_search_call",
                                 "function_call", "item_reference"]),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "x"]),
        "content": TEXT | JSON | st.lists(TEXT_PART | RESPONSES_MEDIA_PART, max_size=5),
        "output": TEXT | JSON | st.lists(TEXT_PART | RESPONSES_MEDIA_PART, max_size=2),
        "name": TEXT, "namespace": TEXT | JSON,
        "encrypted_content": TEXT | JSON, "action": JSON}),
        max_size=3) | JSON, "instructions": TEXT | JSON,
        "tools": st.lists(st.fixed_dictionaries({
            "type": st.sampled_from(["function", "custom", "namespace", "local_shell",
                                     "web_search", "mcp", "x"]),
            "name": TEXT, "tools": JSON, "format": JSON, "parameters": JSON}), max_size=3)
        | JSON,
        "include": st.just(["reasoning.encrypted_content"]) | JSON,
        "max_output_tokens": st.integers(-2, 6) | JSON, "previous_response_id": TEXT,
        "text": st.just({"format": {"type": "json_object"}}) | JSON,
        "background": st.booleans() | JSON, "store": st.booleans() | JSON,
        "conversation": TEXT | st.fixed_dictionaries({"id": TEXT | JSON}) | JSON},
    "/v1/embeddings": {"model": JSON, "input": TEXT | st.lists(TEXT, max_size=4) | JSON,
                       "encoding_format": st.sampled_from(["float", "base64", "int8"]) | JSON,
                       "dimensions": st.integers(-2, 2000) | JSON},
    "/v1/tokenize": {"prompt": TEXT | JSON, "messages": st.lists(MESSAGE, max_size=2) | JSON,
                     "add_special": st.booleans() | JSON, "with_pieces": st.booleans() | JSON},
    "/v1/detokenize": {"tokens": st.lists(st.integers(-5, 300000), max_size=8) | JSON},
    "/apply-template": {"messages": st.lists(MESSAGE, max_size=3) | JSON,
                        "tools": st.lists(TOOL, max_size=2) | JSON,
                        "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
                        "chat_template_kwargs": st.just({"enable_thinking": False}) | JSON,
                        "reasoning_effort": st.sampled_from(["low", "none"]) | JSON},
    "/v1/messages": {**ANTHROPIC, "max_tokens": st.integers(-2, 6) | JSON,
                     "stream": st.booleans() | JSON,
                     "stop_sequences": st.lists(TEXT, max_size=3) | JSON},
    "/v1/messages/count_tokens": ANTHROPIC,
    "/infill": {"input_prefix": TEXT | JSON, "input_suffix": TEXT | JSON, "prompt": TEXT,
                "input_extra": st.lists(st.fixed_dictionaries({"filename": TEXT | JSON,
                                                               "text": TEXT | JSON}),
                                        max_size=2) | JSON,
                "n_predict": st.integers(-2, 6) | JSON, "stream": st.booleans() | JSON,
                "lora": COMMON["lora"], "model": MODEL,
                "temperature": COMMON["temperature"]},
}

# the Responses routes that take a response request or items without generating
ENDPOINTS["/v1/responses/input_tokens"] = {
    k: v for k, v in ENDPOINTS["/v1/responses"].items()
    if k not in ("max_output_tokens", "background", "store")}
ENDPOINTS["/v1/conversations"] = {
    "items": ENDPOINTS["/v1/responses"]["input"],
    "metadata": st.dictionaries(TEXT, TEXT, max_size=20) | JSON}


# reranking (api/rerank): on the fuzz server (no rank pooling) bodies are parsed, then refused
# by model; ``rerank_bodies`` sends the worst values to real rerankers (tests/test_fuzz.py)
DOCUMENT = TEXT | st.fixed_dictionaries({"text": TEXT}) | JSON
ENDPOINTS.update({
    "/v1/rerank": {"model": MODEL, "query": TEXT | JSON,
                   "documents": st.lists(DOCUMENT, max_size=4) | JSON,
                   "top_n": st.integers(-2, 6) | JSON, "return_documents": st.booleans() | JSON},
    "/v1/score": {"model": MODEL, "text_1": TEXT | st.lists(TEXT, max_size=3) | JSON,
                  "text_2": TEXT | st.lists(DOCUMENT, max_size=3) | JSON},
})


# Ollama's routes (api/ollama): names with tags, options, images as base64 lists; each field
# mostly of the right type, so bodies get past the first check to the deeper ones


JUNK = st.sampled_from([None, 7, -1.5, True, "x", [], {}, ["x"], {"a": 1}])


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` five times in six, else a value of another type (any JSON there would make
    most bodies fail their first check)."""
    return st.sampled_from([True] * 5 + [False]).flatmap(lambda ok: valid if ok else JUNK)


OLLAMA_MODEL = mostly(st.sampled_from(
    ["gemma-3-270m"] * 6 + ["gemma-3-270m:latest", "gemma-3-270m:1b", "style-a",
                            "style-a:latest", "x", "x:latest", ""]))
OLLAMA_IMAGE = st.one_of(base64_payloads(), st.just(_b64(samples.png())), data_urls())
OLLAMA_IMAGES = mostly(st.lists(st.sampled_from([_b64(samples.png()), _b64(samples.GIF), "",
                                                 "!!", "aGk="]), max_size=2))
OLLAMA_OPTIONS = mostly(st.fixed_dictionaries({}, optional={
    "temperature": COMMON["temperature"], "top_p": COMMON["top_p"], "top_k": COMMON["top_k"],
    "min_p": mostly(st.floats(-1, 2, allow_nan=False)), "seed": COMMON["seed"],
    "num_predict": mostly(st.integers(-3, 6)), "stop": COMMON["stop"],
    "repeat_penalty": mostly(st.floats(-1, 12, allow_nan=False)),
    "repeat_last_n": mostly(st.integers(-3, 100)),
    "presence_penalty": mostly(st.floats(-3, 3, allow_nan=False)),
    "frequency_penalty": mostly(st.floats(-3, 3, allow_nan=False)),
    "num_ctx": mostly(st.integers(-2, 10**6)), "mirostat": JSON}))
OLLAMA_MESSAGE = st.fixed_dictionaries({
    "role": mostly(st.sampled_from(["user", "user", "system", "assistant", "tool", "USER",
                                    "x"])),
    "content": mostly(TEXT)}, optional={
    "images": OLLAMA_IMAGES, "thinking": mostly(TEXT), "tool_name": mostly(TEXT),
    "tool_calls": mostly(st.lists(st.fixed_dictionaries({"function": st.fixed_dictionaries({
        "name": mostly(st.sampled_from(["f", ""])), "arguments": JSON})}), max_size=2))})
OLLAMA_COMMON: dict[str, Any] = {
    "model": OLLAMA_MODEL, "options": OLLAMA_OPTIONS, "stream": mostly(st.booleans()),
    "keep_alive": mostly(st.sampled_from(["5m", 0, -1, "0", "x", "1h30m", "-1"])),
    "format": mostly(st.sampled_from(["json", "", {"type": "object"}, {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}])),
    "think": mostly(st.sampled_from([True, False, "low", "max", "x"])), "unknown_field": JSON}
ENDPOINTS.update({
    "/api/chat": {**OLLAMA_COMMON, "messages": mostly(st.lists(OLLAMA_MESSAGE, max_size=3)),
                  "tools": mostly(st.lists(TOOL, max_size=2))},
    "/api/generate": {**OLLAMA_COMMON, "prompt": mostly(TEXT), "suffix": mostly(TEXT),
                      "system": mostly(TEXT), "raw": mostly(st.booleans()),
                      "template": mostly(st.sampled_from(["", "", "{{ .Prompt }}"])),
                      "context": mostly(st.lists(st.integers(-5, 300000), max_size=5)),
                      "images": OLLAMA_IMAGES},
    "/api/embed": {"model": OLLAMA_MODEL, "input": mostly(TEXT | st.lists(TEXT, max_size=4)),
                   "truncate": mostly(st.booleans()),
                   "dimensions": mostly(st.integers(-2, 2000)), "options": JSON,
                   "keep_alive": OLLAMA_COMMON["keep_alive"]},
    "/api/embeddings": {"model": OLLAMA_MODEL, "prompt": mostly(TEXT), "options": JSON},
    "/api/show": {"model": OLLAMA_MODEL, "name": OLLAMA_MODEL, "verbose": JSON},
    "/api/pull": {"model": OLLAMA_MODEL | st.just("llama3"), "stream": mostly(st.booleans()),
                  "insecure": JSON},
})


ALL_PATHS = tuple(sorted(ENDPOINTS))
# the /v1 (and llama-server) routes: what a Responses WebSocket frame is fuzzed with
V1_PATHS = tuple(p for p in ALL_PATHS if not p.startswith("/api/"))


@st.composite
def request_bodies(draw: st.DrawFn, paths: tuple[str, ...] = ALL_PATHS) -> tuple[str, Any]:
    """(path, body): usually an object with a random subset of the endpoint's fields,
    sometimes not an object at all. Ollama's routes need a ``model``: mostly there."""
    path = draw(st.sampled_from(paths))
    if draw(st.integers(0, 19)) == 0:
        return path, draw(JSON)
    fields = ENDPOINTS[path]
    keys = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
    if path.startswith("/api/") and "model" not in keys and \
            _pick(draw, {"add": 4, "leave": 1}) == "add":
        keys.append("model")
    return path, {k: draw(fields[k]) for k in keys}


# weighted: where media go most ways (completions: only the LoRA choice)
MEDIA_PATHS = ("/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions",
               "/v1/responses", "/v1/responses", "/v1/messages", "/v1/messages",
               "/v1/messages/count_tokens", "/v1/completions", "/v1/tokenize", "/api/chat",
               "/api/generate")


@st.composite
def media_bodies(draw: st.DrawFn, paths: tuple[str, ...] = MEDIA_PATHS) -> tuple[str, Any]:
    """(path, body): a valid request but for its media parts (in any role's message, a
    Responses message or tool output, an Anthropic user turn, tool result or system) and its
    LoRA choice (``lora`` field, ``model`` naming an adapter)."""
    path = draw(st.sampled_from(paths))
    extra: dict[str, Any] = {}
    if draw(st.integers(0, 2)) == 0 or path == "/v1/completions":
        extra["lora"] = draw(LORA)
    if draw(st.integers(0, 3)) == 0:
        extra["model"] = draw(MODEL)
    if draw(st.integers(0, 3)) == 0:
        extra["stream"] = True
    if path.startswith("/api/"):  # Ollama: base64 images on a message or the prompt
        extra.pop("lora", None)
        images = draw(st.lists(OLLAMA_IMAGE, min_size=1, max_size=5))
        body: dict[str, Any] = {"model": "gemma-3-270m", "stream": False,
                                "options": {"num_predict": 1}, **extra}
        if path == "/api/generate":
            return path, {**body, "prompt": "What is this?", "images": images}
        role = draw(st.sampled_from(["user", "user", "system", "assistant", "tool"]))
        messages = [{"role": role, "content": "What is this?", "images": images}]
        return path, {**body, "messages": messages if role == "user" else
                      [*messages, {"role": "user", "content": "Hi"}]}
    if path in ("/v1/chat/completions", "/v1/tokenize"):
        role = draw(st.sampled_from(["user", "user", "user", "system", "assistant", "tool",
                                     "developer"]))
        many = draw(st.integers(0, 7)) == 0
        message: dict[str, Any] = {"role": role, "content": draw(MANY_MEDIA) if many else
                                   draw(st.lists(CHAT_MEDIA_PART | TEXT_PART, min_size=1,
                                                 max_size=4))}
        if role == "tool":
            message["tool_call_id"] = "c1"
        messages = [message] if role == "user" else [message, {"role": "user",
                                                                "content": "Hi"}]
        if path == "/v1/tokenize":
            return path, {"messages": messages}
        return path, {"messages": messages, "max_tokens": 1, **extra}
    if path == "/v1/responses":
        parts = draw(st.lists(RESPONSES_MEDIA_PART | TEXT_PART, min_size=1, max_size=4))
        if draw(st.integers(0, 4)) == 0:  # a tool's output with images
            items: list[Any] = [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": parts}]
        else:
            items = [{"type": "message", "role": draw(st.sampled_from(
                ["user", "user", "system", "developer", "assistant"])), "content": parts}]
        if draw(st.booleans()):
            items.append({"type": "message", "role": "user", "content": "Hi"})
        return path, {"input": items, "max_output_tokens": 1, **extra}
    if path.startswith("/v1/messages"):
        blocks = draw(st.lists(ANTHROPIC_IMAGE | st.just({"type": "text", "text": "Hi"}),
                               min_size=1, max_size=3))
        where = draw(st.sampled_from(["user", "user", "tool_result", "system", "assistant"]))
        if where == "tool_result":
            messages = [{"role": "assistant", "content": [
                            {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                        {"role": "user", "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": blocks}]}]
            messages.insert(0, {"role": "user", "content": "Hi"})
        elif where in ("user", "assistant"):
            messages = [{"role": where, "content": blocks}]
            if where == "assistant":
                messages.insert(0, {"role": "user", "content": "Hi"})
        else:
            messages = [{"role": "user", "content": "Hi"}]
            extra["system"] = blocks
        body = {"messages": messages, **extra}
        return path, body if path.endswith("count_tokens") else {**body, "max_tokens": 1}
    return path, {"prompt": "Hi", "max_tokens": 1, **extra}


def post(http: httpx.Client, case: tuple[str, Any]) -> httpx.Response:
    """Send one generated (path, body) as raw JSON (bodies need not be objects)."""
    path, body = case
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


# -- hostile bodies: raw JSON text no json.dumps of a Python value would give ---------------

NUMBER_FIELDS = ["temperature", "top_p", "top_k", "n", "seed", "max_tokens", "logprobs",
                 "top_logprobs", "presence_penalty", "frequency_penalty", "repeat_penalty",
                 "min_p", "dimensions", "max_output_tokens", "max_completion_tokens", "top_n",
                 "thinking_budget_tokens", "reasoning_budget_tokens"]
OLLAMA_NUMBER_FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "num_predict",
                        "repeat_penalty", "repeat_last_n", "presence_penalty",
                        "frequency_penalty", "num_ctx", "dimensions"]
TEXT_FIELDS = ["prompt", "input", "instructions", "model", "stop", "suffix",
               "previous_response_id"]
# boundaries of every numeric field's type: the edges the validators check, machine-word
# edges, float edges and values just past them
BOUNDARY_NUMBERS = ["0", "-0", "1", "-1", "2", "0.5", "-0.0", "1e-400", "2.0000000001",
                    "1.7976931348623157e308", "5e-324", "4294967295", "4294967296",
                    "2147483647", "-2147483648", "9223372036854775807", "-9223372036854775808",
                    "18446744073709551615", "18446744073709551616", "1e308", "262143", "262144",
                    "100", "101", "-100", "-101", "20", "21", "true", "false", "null", "\"1\"",
                    "[]", "{}"]
HUGE_NUMBERS = st.one_of(
    st.integers(300, 6000).map(lambda k: "1" + "0" * k),
    st.integers(300, 6000).map(lambda k: "-0." + "1" * k),
    st.sampled_from(["1e400", "-1e400", "1e99999", "NaN", "Infinity", "-Infinity", "1E+309",
                     "123456789012345678901234567890e-5"]))
# any code point, surrogates included (json.dumps escapes them as \udXXX)
WILD_TEXT = st.text(st.characters(blacklist_categories=()), max_size=30) | st.sampled_from([
    "\ud83d", "\udc00x", "a\x00b", "\U0010ffff", "\ufffe\uffff", "\u2028\u2029", "\U0001f600",
    "\ud83d\ude00"])


def _nest(depth: int, open_: str, close: str, inner: str = "1") -> str:
    return open_ * depth + inner + close * depth


DEEP = st.builds(lambda d, kind, balanced: (
    _nest(d, "[", "]") if kind == 0 else
    _nest(d, '{"a":', "}") if kind == 1 else
    _nest(d, '[{"x":', "}]"))[: None if balanced else d],
    st.sampled_from([30, 63, 64, 65, 200, 999, 1000, 1001, 5000, 20000]),
    st.integers(0, 2), st.booleans())


@st.composite
def hostile_bodies(draw: st.DrawFn, paths: tuple[str, ...] = ALL_PATHS) -> tuple[str, bytes]:
    """(path, raw body): a near-valid body with one hostile part, or a hostile whole."""
    path = draw(st.sampled_from(paths))
    base = {"prompt": "Hi", "input": "Hi", "messages": [{"role": "user", "content": "Hi"}],
            "tokens": [1, 2], "max_tokens": 2, "max_output_tokens": 2}
    ollama = path.startswith("/api/")
    if ollama:
        base["model"] = "gemma-3-270m"
    parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in base.items()]
    kind = draw(st.sampled_from(["deep", "deep_whole", "text", "key", "number", "boundary",
                                 "duplicate", "bad_utf8", "long", "arguments", "media",
                                 "lora"]))
    if kind == "deep":
        parts.append(f'{json.dumps(draw(st.sampled_from([*sorted(base), "tools"])))}: '
                     f"{draw(DEEP)}")
        parts = parts[1:] if parts[-1].startswith('"prompt"') else parts
    elif kind == "deep_whole":
        return path, draw(DEEP).encode()
    elif kind == "text":
        field = draw(st.sampled_from([*TEXT_FIELDS, "messages"]))
        text = draw(WILD_TEXT)
        value = [{"role": "user", "content": text}] if field == "messages" else text
        parts = [p for p in parts if not p.startswith(json.dumps(field))]
        parts.append(f"{json.dumps(field)}: {json.dumps(value)}")
    elif kind == "arguments":  # JSON inside a string: a tool call's arguments
        inner = draw(DEEP | WILD_TEXT.map(lambda t: json.dumps({"a": t}))
                     | HUGE_NUMBERS.map(lambda n: '{"a": ' + n + "}"))
        messages = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": inner}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        parts = [p for p in parts if not p.startswith('"messages"')]
        parts.append(f'"messages": {json.dumps(messages)}')
        parts.append('"input": ' + json.dumps([{"type": "function_call", "call_id": "c1",
                                                "name": "f", "arguments": inner}]))
        parts = [p for p in parts if not p.startswith('"input": "')]
    elif kind == "media":  # one hostile value inside an image / audio part
        wild = draw(DEEP | WILD_TEXT.map(json.dumps) | HUGE_NUMBERS
                    | WILD_TEXT.map(lambda t: json.dumps("data:image/png;base64," + t)))
        chat_part, item_part = draw(st.sampled_from([
            ('{"type": "image_url", "image_url": {"url": %s}}',
             '{"type": "input_image", "image_url": %s}'),
            ('{"type": "image_url", "image_url": %s}',
             '{"type": "input_image", "image_url": "data:,", "detail": %s}'),
            ('{"type": "image_url", "image_url": {"url": "data:,", "detail": %s}}',
             '{"type": "input_image", "file_id": %s}'),
            ('{"type": "input_audio", "input_audio": {"data": %s, "format": "wav"}}',
             '{"type": "input_audio", "input_audio": {"data": %s}}'),
            ('{"type": "input_audio", "input_audio": {"data": "", "format": %s}}',
             '{"type": "input_audio", "input_audio": %s}'),
            ('{"type": "audio_url", "audio_url": {"url": %s}}',
             '{"type": %s, "image_url": "data:,"}')]))
        parts = [p for p in parts if not p.startswith(('"messages"', '"input"'))]
        if ollama:
            parts.append(f'"images": [{wild}]')
            parts.append(f'"messages": [{{"role": "user", "content": "Hi", "images": [{wild}]}}]')
        else:
            parts.append('"messages": [{"role": "user", "content": [%s]}]'
                         % (chat_part % wild))
        parts.append('"input": [{"type": "message", "role": "user", "content": [%s]}]'
                     % (item_part % wild))
    elif kind == "lora":
        wild = draw(DEEP | WILD_TEXT.map(json.dumps) | HUGE_NUMBERS
                    | st.sampled_from(BOUNDARY_NUMBERS))
        parts.append('"lora": ' + draw(st.sampled_from([
            '%s', '[%s]', '[{"id": %s}]', '[{"name": %s}]', '[{"id": 0, "scale": %s}]',
            '[{"name": "style-a", "scale": %s}, {"name": "style-a", "scale": 1}]'])) % wild)
        if draw(st.booleans()):
            parts.append('"model": ' + draw(st.sampled_from(['"style-a"', '"style-b"'])))
    elif kind == "key":
        parts.append(f"{json.dumps(draw(WILD_TEXT))}: 1")
    elif kind in ("number", "boundary"):
        field = draw(st.sampled_from(OLLAMA_NUMBER_FIELDS if ollama else NUMBER_FIELDS))
        value = draw(HUGE_NUMBERS if kind == "number" else st.sampled_from(BOUNDARY_NUMBERS))
        parts = [p for p in parts if not p.startswith(json.dumps(field))]
        parts.append(f'"options": {{{json.dumps(field)}: {value}}}' if ollama
                     else f"{json.dumps(field)}: {value}")
    elif kind == "duplicate":
        parts.append(draw(st.sampled_from(parts)))
    elif kind == "long":
        field = draw(st.sampled_from(["prompt", "input", "stop", "tokens"]))
        n = draw(st.sampled_from([10_000, 300_000]))
        value = json.dumps(list(range(n)) if field == "tokens" else "ab" * n)
        parts = [p for p in parts if not p.startswith(json.dumps(field))]
        parts.append(f"{json.dumps(field)}: {value}")
    raw = ("{" + ", ".join(draw(st.permutations(parts))) + "}").encode()
    if kind == "bad_utf8":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xed\xa0\xbd", b"\xc3", b"\x00",
                                               b"\xf4\x90\x80\x80"])) + raw[at:]
    return path, raw


def any_bodies() -> st.SearchStrategy[tuple[str, bytes]]:
    """Near-valid bodies (as raw JSON), media / LoRA bodies and hostile ones, a third each."""
    return st.one_of(request_bodies().map(lambda c: (c[0], json.dumps(c[1]).encode())),
                     media_bodies().map(lambda c: (c[0], json.dumps(c[1]).encode())),
                     hostile_bodies())


def post_raw(http: httpx.Client, case: tuple[str, bytes]) -> httpx.Response | None:
    """Send one raw body; None when the connection was dropped without a response."""
    path, raw = case
    try:
        return http.post(path, content=raw, headers={"content-type": "application/json"})
    except httpx.TransportError:
        return None


def check_error_shape(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        if r.request.url.path.startswith("/api/"):  # Ollama's shape there
            assert set(body) == {"error"} and isinstance(body["error"], str), r.text[:300]
            return
        if r.request.url.path.startswith("/v1/messages"):  # Anthropic's shape there
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, \
                r.text[:300]
            return
        assert set(body["error"]) == {"message", "type", "param", "code"}, r.text[:300]


# -- reranking's worst values, for real rerankers (tests/make_reranker_models.py) ----------

RERANKERS = ("reranker-bert", "reranker-qwen3")
# what a prompt template or tokenizer could trip on: special-token text (parsed as specials
# in a rerank template, as llama-server does), the template's own placeholders, texts at and
# past the context (512 positions for the BERT reranker), empty ones, any code point
RERANK_TEXT = WILD_TEXT | st.sampled_from([
    "", " ", "<|im_end|>", "<|im_start|>assistant\n", "<|endoftext|>", "[SEP]", "[CLS] [PAD]",
    "{query}", "{document}", "{document}{query}", "<think>", "yes", "no", "\n" * 50]) | \
    st.sampled_from([500, 505, 510, 513, 2100]).map(lambda k: "word " * k)


@st.composite
def rerank_bodies(draw: st.DrawFn) -> tuple[str, Any]:
    """A /v1/rerank or /v1/score body for a reranker: hostile texts, many documents, top_n
    at its edges."""
    path = draw(st.sampled_from(["/v1/rerank", "/rerank", "/v1/score"]))
    many = draw(st.sampled_from([0, 0, 0, 0, 1023, 1024, 1025]))
    # many documents go to the BERT reranker: the qwen3 one computes (as llama.cpp does for
    # every causal model) its 152k-token LM head on every prompt token, ~1,400 tokens/s here
    model = "reranker-bert" if many else draw(st.sampled_from([*RERANKERS, *RERANKERS, None,
                                                                "", "x"]))
    docs: list[Any] = ["d"] * many if many else draw(st.lists(
        RERANK_TEXT | st.fixed_dictionaries({"text": RERANK_TEXT}) | JUNK, max_size=6))
    if path == "/v1/score":
        text = st.sampled_from(["q", "<|im_end|>"]) if many else RERANK_TEXT
        text_1 = draw(text | st.lists(text, min_size=len(docs), max_size=len(docs)) | JUNK)
        return path, {"model": model, "text_1": text_1, "text_2": docs}
    # a thousand documents with a query near the context would be a million tokens of work
    query = draw(st.sampled_from(["q", "", "{document}"]) if many else RERANK_TEXT | JUNK)
    body = {"model": model, "query": query, "documents": docs}
    if draw(st.booleans()):
        body["top_n"] = draw(st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, -2**63, 1.0, "1",
                                              None, True]) | st.integers(-3, 8))
    if draw(st.booleans()):
        body["return_documents"] = draw(st.booleans() | JUNK)
    return path, body


# -- WebSocket frames ------------------------------------------------------------------------

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@st.composite
def ws_frames(draw: st.DrawFn) -> tuple[str, str | bytes]:
    """(kind, frame): a response.create that may be hostile, sent as text or binary,
    an oversize frame, or a pair of interleaved creates (kind ``interleaved``)."""
    kind = draw(st.sampled_from(["valid", "fuzzed", "hostile", "binary", "binary_junk",
                                 "oversize", "interleaved", "media"]))
    create = {"type": "response.create", "model": "x", "input": "Say hi.",
              "max_output_tokens": 2}
    if kind in ("valid", "interleaved"):
        return kind, json.dumps(create)
    if kind == "media":  # media parts and LoRA choices in a response.create
        _, body = draw(media_bodies(("/v1/responses",)))
        body.pop("stream", None)
        return kind, json.dumps({"type": "response.create", **body})
    if kind == "fuzzed":
        _, body = draw(request_bodies(V1_PATHS))
        if isinstance(body, dict):
            body = {"type": "response.create", **body}
        return kind, json.dumps(body)
    if kind == "hostile":
        _, raw = draw(hostile_bodies(V1_PATHS))
        text = raw.decode("utf-8", "replace")
        if text.startswith("{") and draw(st.booleans()):
            text = '{"type": "response.create", ' + text[1:]
        return kind, text
    if kind == "binary":
        return kind, json.dumps(create).encode()
    if kind == "binary_junk":
        return kind, draw(st.binary(max_size=64))
    return kind, json.dumps({**create, "input": "x" * 70_000})  # past max_body_bytes 64 KiB


def ws_exchange(ws: Any, kind: str, frame: str | bytes, timeout: float = 60) -> list[str]:
    """Send a frame (two creates for ``interleaved``) and read until every reply came:
    an ``error`` event or a terminal response event per create. Returns what was seen
    ("error:<code>:<status>" or the terminal type)."""
    frames = [frame, frame] if kind == "interleaved" else [frame]
    for f in frames:
        ws.send(f)
    seen: list[str] = []
    answered = 0
    while answered < len(frames):
        event = json.loads(ws.recv(timeout=timeout))
        if event["type"] == "error":
            seen.append(f"error:{event['error']['code']}:{event['status']}")
            answered += 1
        elif event["type"] in TERMINAL:
            seen.append(event["type"])
            answered += 1
    return seen


# -- session keys and response ids (sticky routing, the shared Responses store) -------------

# header bytes a client can send: visible ASCII, tabs and spaces inside, and any byte from
# 0x80 (HTTP forbids other control bytes on the wire and strips whitespace at the ends)
HEADER_BYTES = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c != 127).strip(b" \t")) | st.sampled_from([
        b"", b"a\tb", b"a" * 300, b"k" * 8000, b"\xff\xfe", b"caf\xc3\xa9", b"../../etc",
        b"resp_00.key", b"%00", b"\x85\x9b[31m\xa0"])
HOSTILE_IDS = st.sampled_from([
    "../../etc/passwd", "resp_00.../../x", "resp_ab.key/../../y", ".lock", ".tmp-x", "..",
    "resp_" + "a" * 5000, "resp_\u0000x", "resp_\ud800", "resp_0.k\u2028", "", " ",
    "resp_00." + "k" * 65, "resp_00.a b", "resp_00.ключ", "resp_ab.\U0001f600",
    "/etc/passwd", "\\\\server\\share", "C:\\x", "resp_1.json", ".background",
    ".background/x", "conv_", "conv_../../x", "conv_" + "c" * 300]) | WILD_TEXT
LIST_QUERIES = st.fixed_dictionaries({}, optional={
    "limit": st.sampled_from(["0", "-1", "1", "100", "101", "x", "1e3", "", "9" * 30]),
    "order": st.sampled_from(["asc", "desc", "x", ""]),
    "after": st.sampled_from(["msg_x", "", "a" * 500, "../x"])})


@st.composite
def session_cases(draw: st.DrawFn) -> tuple[str, str, dict[str, bytes], bytes]:
    """(method, path, headers, raw body): session keys in headers and bodies, and hostile
    response ids in previous_response_id and in the /v1/responses/{id} path."""
    headers = {"content-type": b"application/json"}
    for name in draw(st.sets(st.sampled_from(["x-session-id", "session_id"]))):
        headers[name] = draw(HEADER_BYTES)
    kind = draw(st.sampled_from(["chat", "responses", "anthropic", "get", "delete", "by_id"]))
    if kind in ("get", "delete", "by_id"):
        def quoted() -> str:
            rid = draw(HOSTILE_IDS)
            return "".join(c if c.isalnum() or c in "_.-" else
                           "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                           for c in rid) or "x"
        if kind != "by_id":
            return kind.upper(), f"/v1/responses/{quoted()}", headers, b""
        # the other routes that take an id in the path (and list queries)
        method, template = draw(st.sampled_from([
            ("GET", "/v1/responses/{}/input_items"), ("POST", "/v1/responses/{}/cancel"),
            ("GET", "/v1/conversations/{}"), ("DELETE", "/v1/conversations/{}"),
            ("POST", "/v1/conversations/{}"), ("GET", "/v1/conversations/{}/items"),
            ("POST", "/v1/conversations/{}/items"), ("GET", "/v1/conversations/{}/items/{}"),
            ("DELETE", "/v1/conversations/{}/items/{}"), ("GET", "/v1/models/{}")]))
        path = template.format(*(quoted() for _ in range(template.count("{}"))))
        query = draw(LIST_QUERIES)
        if query:
            path += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        body = json.dumps(draw(JSON)).encode() if method == "POST" else b""
        return method, path, headers, body
    user: Any = draw(WILD_TEXT | st.sampled_from(["u" * 300, "user-1", None, 7, [], {}]))
    if kind == "chat":
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}],
                                "max_tokens": 1, "user": user}
        path = "/v1/chat/completions"
    elif kind == "anthropic":
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                "metadata": draw(st.sampled_from([{"user_id": user}, {"user_id": None}, {},
                                                  None, "x"]))}
        path = "/v1/messages"
    else:
        body = {"input": "Hi", "max_output_tokens": 1, "user": user,
                "previous_response_id": draw(HOSTILE_IDS)}
        if draw(st.booleans()):
            del body["previous_response_id"]
        if draw(st.integers(0, 3)) == 0:  # a conversation id instead (or both: a 400)
            body["conversation"] = draw(HOSTILE_IDS | st.just({"id": "conv_x"}) | JSON)
        path = "/v1/responses"
    return "POST", path, headers, json.dumps(body).encode()

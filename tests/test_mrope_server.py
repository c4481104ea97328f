"""M-RoPE images (the Qwen-VL family) through a real server, against llama.cpp's own decode.

The model and projector are random-weight ``qwen2vl`` + ``qwen2vl_merger`` GGUFs from
tests/make_vision_model.py: they test the plumbing (an image takes nx * ny KV cells but
advances the position by max(nx, ny); its rows carry four position components; text after
it continues from there), not what a model sees. Every answer here is compared with an
independent greedy decode of the same prompt through the bindings and mtmd's helper
(tests/mrope_reference.py: ``mtmd_helper_eval_chunks``, llama.cpp's positions), so a
wrong position anywhere — first turn, chunked prefill, cached or copied prefix, disk
entry, next to other sequences — changes the text and fails the test.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from make_hybrid_model import write_hybrid_model
from make_vision_model import VisionSpec, write_merger_projector, write_vision_model
from mrope_reference import MARKER, Reference, greedy
from openai import BadRequestError, OpenAI
from test_multimodal_server import data_url, png

from conftest import ServerProcess, qwen_config, start_server

SYSTEM = "You look at pictures."
N = 10  # tokens per answer


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    text, mmproj = write_vision_model()
    return {"model": text, "mmproj": mmproj, "cache": tmp_path_factory.mktemp("mrope-cache")}


def config(files: dict[str, Path]) -> dict[str, Any]:
    cfg = qwen_config(n_seq_max=8, n_ctx=8192, n_batch=24, n_ubatch=24, threads=1,
                      threads_batch=1, kv_unified=False,  # bit-identical to a fresh context
                      mtmd={"mmproj_path": str(files["mmproj"]),
                            "embedding_cache": {"path": str(files["cache"] / "media")}})
    cfg["model"].update(path=str(files["model"]), alias="qwen2vl")
    cfg["disk_cache"] = {"path": str(files["cache"] / "seq"), "min_tokens": 16}
    return cfg


@pytest.fixture(scope="module")
def server(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    s = start_server(config(files), tmp_path_factory.mktemp("mrope"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def render(turns: list[tuple[str, str]]) -> str:
    """The Qwen2.5 template's text for (role, content) turns, MARKER where images go."""
    out = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for role, content in turns:
        out += f"<|im_start|>{role}\n{content}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def reference(files: dict[str, Path], turns: list[tuple[str, str]],
              images: list[bytes]) -> Reference:
    return greedy(str(files["model"]), str(files["mmproj"]), render(turns), images, N,
                  n_batch=512)


def user(*parts: Any) -> dict[str, Any]:
    content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    return {"role": "user", "content": content}


def image(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


def chat(client: OpenAI, messages: list[Any], n: int = N) -> Any:
    return client.chat.completions.create(
        model="qwen2vl", temperature=0, max_tokens=n,
        messages=[{"role": "system", "content": SYSTEM}, *messages])


def cached(r: Any) -> int:
    return int(r.usage.prompt_tokens_details.cached_tokens or 0)


WIDE = png(1, 64, 32)  # 4 x 2 grid: 8 tokens, 4 positions
SQUARE = png(2, 48, 48)  # 3 x 3: 9 tokens, 3 positions
BIG = png(3, 128, 64)  # 8 x 4: 32 tokens, more than n_batch: its rows span two decodes


def test_the_generated_pair_uses_mrope_in_llama_cpp(files: dict[str, Path]) -> None:
    ref = reference(files, [("user", f"Look:{MARKER}What is it?")], [WIDE])
    assert ref.uses_mrope
    kinds = [(c.kind, c.n_tokens, c.n_pos, c.grid) for c in ref.chunks]
    assert kinds[1] == ("image", 8, 4, (4, 2))
    assert ref.n_pos == ref.n_tokens - 4
    assert len(ref.tokens) == N and len(set(ref.tokens)) > 2  # not one repeated token


def test_image_answer_equals_llama_cpps_own_decode(client: OpenAI,
                                                   files: dict[str, Path]) -> None:
    for data, (nx, ny) in ((WIDE, (4, 2)), (SQUARE, (3, 3)), (BIG, (8, 4))):
        r = chat(client, [user("Look:", image(data), "What is it?")])
        ref = reference(files, [("user", f"Look:{MARKER}What is it?")], [data])
        assert ref.chunks[1].grid == (nx, ny)
        assert r.usage.prompt_tokens == ref.n_tokens  # KV cells, as llama-server counts
        assert r.choices[0].message.content == ref.text


def test_two_images_and_text_between(client: OpenAI, files: dict[str, Path]) -> None:
    r = chat(client, [user("First:", image(SQUARE), "then:", image(WIDE), "Compare.")])
    ref = reference(files, [("user", f"First:{MARKER}then:{MARKER}Compare.")],
                    [SQUARE, WIDE])
    assert r.usage.prompt_tokens == ref.n_tokens and ref.n_pos == ref.n_tokens - 6 - 4
    assert r.choices[0].message.content == ref.text


def test_same_image_again_is_cached_whole(client: OpenAI, files: dict[str, Path]) -> None:
    msgs = [user("Cache this one:", image(WIDE), "What is it?")]
    first = chat(client, msgs)
    again = chat(client, msgs)
    assert cached(again) == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    other = chat(client, [user("Cache this one:", image(SQUARE), "What is it?")])
    ref = reference(files, [("user", f"Cache this one:{MARKER}What is it?")], [SQUARE])
    assert 0 < cached(other) < first.usage.prompt_tokens - 8  # the text before, not the image
    assert other.choices[0].message.content == ref.text


def test_follow_up_reuses_the_text_after_the_image(client: OpenAI, server: ServerProcess,
                                                   files: dict[str, Path]) -> None:
    msgs: list[Any] = [user("Remember:", image(BIG), "Noted?")]
    first = chat(client, msgs)
    answer = first.choices[0].message.content
    encodes = server.metrics()["llamaserve_media_encode_seconds_count"]
    msgs += [{"role": "assistant", "content": answer}, user("And in one word?")]
    follow = chat(client, msgs)
    # the image, the text after it and the answer come from the cache
    assert cached(follow) >= first.usage.prompt_tokens
    assert server.metrics()["llamaserve_media_encode_seconds_count"] == encodes
    ref = reference(files, [("user", f"Remember:{MARKER}Noted?"), ("assistant", answer),
                            ("user", "And in one word?")], [BIG])
    assert follow.usage.prompt_tokens == ref.n_tokens
    assert follow.choices[0].message.content == ref.text
    # a second conversation diverging after the image copies the shared prefix
    branch = chat(client, [user("Remember:", image(BIG), "Something else?")])
    ref = reference(files, [("user", f"Remember:{MARKER}Something else?")], [BIG])
    assert cached(branch) >= 3 + 32  # system, "Remember:", the image
    assert branch.choices[0].message.content == ref.text


def test_four_image_requests_next_to_text_requests(client: OpenAI,
                                                   files: dict[str, Path]) -> None:
    images = [png(40 + i, 64 - 16 * (i % 2), 32 + 16 * i) for i in range(4)]
    jobs: list[tuple[list[Any], list[tuple[str, str]], list[bytes]]] = [
        ([user(f"Picture {i}:", image(d), "Describe.")],
         [("user", f"Picture {i}:{MARKER}Describe.")], [d]) for i, d in enumerate(images)]
    jobs += [([user(f"Plain text request {i}, no picture.")],
              [("user", f"Plain text request {i}, no picture.")], []) for i in range(2)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda j: chat(client, j[0]), jobs))
    for (_, turns, imgs), r in zip(jobs, answers, strict=True):
        ref = reference(files, turns, imgs)
        assert r.usage.prompt_tokens == ref.n_tokens
        assert r.choices[0].message.content == ref.text


def test_anthropic_image_block_is_the_same_prompt(client: OpenAI, server: ServerProcess) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    msg = c.messages.create(
        model="qwen2vl", max_tokens=N, system=SYSTEM, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "Anthropic sees:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(SQUARE).decode()}},
            {"type": "text", "text": "What?"}]}])
    oa = chat(client, [user("Anthropic sees:", image(SQUARE), "What?")])
    total = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert total == oa.usage.prompt_tokens
    assert "".join(b.text for b in msg.content if b.type == "text") == \
        oa.choices[0].message.content


def test_bad_media_are_refused_as_before(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as err:
        chat(client, [user("Broken:", image(b"\x89PNG\r\n\x1a\nnot really"))])
    assert err.value.status_code == 400 and "not an image" in str(err.value)
    assert "content[1]" in str((err.value.body or {}).get("param"))


def test_hybrid_model_with_mrope_images(tmp_path: Path) -> None:
    """Qwen3.5's shape: recurrent + attention layers with (interleaved) M-RoPE, here the
    tiny Qwen3.5-architecture model of tests/make_hybrid_model.py with a merger projector of
    its width: the first turn, a follow-up (the recurrent state reused whole) and a branch
    after the image (resumed from a state snapshot) equal llama.cpp's own decode."""
    text = write_hybrid_model()
    mmproj = write_merger_projector(tmp_path / "hybrid-mmproj.gguf", VisionSpec(n_embd=64))
    files = {"model": text, "mmproj": mmproj}
    cfg = qwen_config(n_seq_max=4, n_ctx=4096, n_batch=24, n_ubatch=24, threads=1,
                      threads_batch=1, kv_unified=False, state_snapshots_max_bytes=64 << 20,
                      mtmd={"mmproj_path": str(mmproj)})
    cfg["model"].update(path=str(text), alias="qwen2vl")
    s = start_server(cfg, tmp_path)
    try:
        c = OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
        first = chat(c, [user("Look:", image(BIG), "What is it?")])
        ref = reference(files, [("user", f"Look:{MARKER}What is it?")], [BIG])
        assert ref.uses_mrope and first.usage.prompt_tokens == ref.n_tokens
        assert first.choices[0].message.content == ref.text
        answer = first.choices[0].message.content
        follow = chat(c, [user("Look:", image(BIG), "What is it?"),
                          {"role": "assistant", "content": answer}, user("And?")])
        ref = reference(files, [("user", f"Look:{MARKER}What is it?"),
                                ("assistant", answer), ("user", "And?")], [BIG])
        assert cached(follow) >= first.usage.prompt_tokens - 1
        assert follow.choices[0].message.content == ref.text
        branch = chat(c, [user("Look:", image(BIG), "Another question?")])
        ref = reference(files, [("user", f"Look:{MARKER}Another question?")], [BIG])
        assert cached(branch) > 0 and branch.choices[0].message.content == ref.text
    finally:
        s.stop()


def test_restart_serves_the_image_conversation_from_disk(
        files: dict[str, Path], server: ServerProcess,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Runs last: restarts the server on the same cache directories."""
    c = OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
    msgs: list[Any] = [user("Keep this for later, " * 4, image(WIDE), "Stored?")]
    first = chat(c, msgs)
    server.stop()
    time.sleep(0.5)
    again = start_server(config(files), tmp_path_factory.mktemp("mrope-restart"))
    try:
        c2 = OpenAI(base_url=again.base_url, api_key="x", max_retries=0, timeout=120)
        answer = first.choices[0].message.content
        follow = chat(c2, [*msgs, {"role": "assistant", "content": answer},
                           user("Still there?")])
        assert cached(follow) >= first.usage.prompt_tokens  # prompt, image, answer from disk
        ref = reference(files, [("user", "Keep this for later, " * 4 + f"{MARKER}Stored?"),
                                ("assistant", answer), ("user", "Still there?")], [WIDE])
        assert follow.choices[0].message.content == ref.text
        m = again.metrics()
        assert m.get("llamaserve_media_encode_seconds_count", 0) == 0
    finally:
        again.stop()

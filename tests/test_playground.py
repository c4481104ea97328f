"""The playground at / in a real browser (Debian's Chromium driven by Playwright) against
the real Qwen2.5-Coder-0.5B: type a question, watch the streamed answer and its stats."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import ROOT, ServerProcess, qwen_config, start_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = os.environ.get("PLAYGROUND_SCREENSHOT")  # e.g. docs/playground.png


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium missing: apt-get install chromium")
        pytest.skip("chromium not installed")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def test_a_question_streams_an_answer_with_stats(browser: Any, qwen_server: ServerProcess,
                                                 tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 760})
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(qwen_server.url + "/")
    assert page.title() == "llamaserve playground"
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "change")
    page.fill("#input", "What is the capital of France? Answer in one sentence.")
    page.press("#input", "Enter")
    stats = page.wait_for_selector(".msg.assistant .stats", timeout=120_000)
    answer = page.inner_text(".msg.assistant .content")
    assert "Paris" in answer, answer
    assert "TTFT" in stats.inner_text() and "tokens/s" in stats.inner_text()
    deadline = time.monotonic() + 10  # polled from here: the page's CSP forbids eval
    while page.inner_text("#s-hit") == "–" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert page.inner_text("#s-hit") != "–"
    assert page.inner_text("#s-kv").endswith("%")
    page.screenshot(path=str(tmp_path / "playground.png"))
    if SCREENSHOT:
        shutil.copy(tmp_path / "playground.png", ROOT / SCREENSHOT)
    # the conversation is kept in the browser: a reload shows it again
    page.reload()
    page.wait_for_selector(".msg.assistant .stats")
    assert page.inner_text(".msg.user") == "What is the capital of France? Answer in one sentence."
    # a code answer is rendered as a code block; stop ends a long answer early
    page.fill("#input", "Write a Python function that adds two numbers, in a code block.")
    page.press("#input", "Enter")
    page.wait_for_selector(".msg.assistant:last-child pre code", timeout=120_000)
    page.wait_for_selector(".msg.assistant:last-child .stats", timeout=120_000)
    # everything the page loaded came from the server itself
    assert requested and all(u.startswith(qwen_server.url + "/") for u in requested), \
        [u for u in requested if not u.startswith(qwen_server.url)]
    page.close()


def test_a_server_with_a_key_asks_for_it_once(browser: Any, tmp_path: Path) -> None:
    cfg = qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "api_key": "sekret-key"}
    server = start_server(cfg, tmp_path)
    try:
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_selector("#keybox", state="visible", timeout=10_000)
        page.fill("#key", "sekret-key")
        page.click("#savekey")
        page.fill("#input", "Say hi.")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant .stats", timeout=120_000)
        assert not page.query_selector(".msg.assistant .error")
        page.close()
    finally:
        server.stop()


def test_playground_false_turns_it_off(tmp_path: Path) -> None:
    cfg = qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "playground": False}
    server = start_server(cfg, tmp_path)
    try:
        r = httpx.get(server.url + "/", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    finally:
        server.stop()


def test_model_picker_and_image_upload(browser: Any, tmp_path: Path) -> None:
    """A ``models`` list: the picker lists the models (not their adapters); the image
    button shows for the model with a projector only; an attached image reaches the model
    as an ``image_url`` part and is encoded (random-weight projector: the plumbing)."""
    from make_test_models import read_base_model, write_projector
    from test_multimodal_server import png

    qwen = qwen_config()["model"]
    mmproj = write_projector(tmp_path / "mmproj.gguf", read_base_model(qwen["path"]).n_embd)
    coder = {**qwen, "alias": "coder", "n_seq_max": 2, "mtmd": {"mmproj_path": str(mmproj)}}
    plain = {**qwen, "alias": "plain", "n_seq_max": 2}
    server = start_server({"server": {"max_loaded_models": 1}, "models": [coder, plain]},
                          tmp_path)
    picture = tmp_path / "cat.png"
    picture.write_bytes(png(1))
    try:
        page = browser.new_page(viewport={"width": 1200, "height": 760})
        bodies: list[str] = []
        page.on("request", lambda r: bodies.append(r.post_data or "")
                if r.url.endswith("/v1/chat/completions") else None)
        page.goto(server.url + "/")
        page.wait_for_selector("#models:not([hidden])")
        assert page.eval_on_selector_all("#models option", "os => os.map(o => o.value)") == \
            ["coder", "plain"]
        page.wait_for_selector("#attach:not([hidden])")  # coder reads images
        page.select_option("#models", "plain")
        page.wait_for_selector("#attach", state="hidden")
        page.select_option("#models", "coder")
        page.wait_for_selector("#attach:not([hidden])")
        page.set_input_files("#image", str(picture))
        page.wait_for_selector("#pending img")
        page.fill("#input", "What is in this picture?")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant .stats", timeout=120_000)
        assert page.query_selector(".msg.user .thumbs img") is not None
        sent = json.loads(bodies[-1])
        assert sent["model"] == "coder"
        parts = sent["messages"][-1]["content"]
        assert parts[0] == {"type": "text", "text": "What is in this picture?"}
        assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'llamaserve_media_encode_seconds_count{model="coder"} 1.0' in metrics
        page.close()
    finally:
        server.stop()


def test_status_panel_shows_batch_progress(browser: Any, tmp_path: Path) -> None:
    """With the Batch API on, the panel's "Batch lines" reads running · queued · done
    (failed) from /metrics; a finished 6-line batch with one bad line shows 5 (1) done."""
    from conftest import tiny_qwen_config
    cfg = tiny_qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "batch_dir": str(tmp_path / "batches")}
    server = start_server(cfg, tmp_path)
    try:
        lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": f"x{i}", "max_tokens": 2 if i else -1}} for i in range(6)]
        f = httpx.post(f"{server.base_url}/files", data={"purpose": "batch"}, files={
            "file": ("in.jsonl", "\n".join(json.dumps(x) for x in lines))}).json()
        b = httpx.post(f"{server.base_url}/batches", json={
            "input_file_id": f["id"], "endpoint": "/v1/completions",
            "completion_window": "24h"}).json()
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.base_url}/batches/{b['id']}").json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        page = browser.new_page()
        page.goto(server.url + "/")
        # polled from here: a wait_for_function predicate that is not true at once is
        # re-evaluated through eval, which the page's CSP (no 'unsafe-eval') refuses
        deadline = time.monotonic() + 10
        while page.inner_text("#s-batch") == "–" and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert page.inner_text("#s-batch") == "0 · 0 · 5 (1)"
    finally:
        server.stop()

"""Flags for config fields: a model served with no config file, flags over -C, and the
equivalent config printed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from conftest import ROOT, free_port, load_config, require_model
from engine.config import ConfigError, parse, validate
from engine.config_flags import add_flags, config_data


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_flags_alone_make_a_config(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}")
    data = config_data(args("-m", "/m.gguf", "--port", "9000", "-c", "2048", "-np", "2",
                            "-t", "3", "--api-key", "k", "-a", "mine",
                            "--chat-template-file", str(template)))
    assert data == {"model": {"path": "/m.gguf", "n_ctx": 2048, "n_seq_max": 2, "threads": 3,
                              "alias": "mine", "chat_template": "{{ messages[0].content }}"},
                    "server": {"port": 9000, "api_key": "k"}}
    config = parse(data)
    assert config.model.n_seq_max == 2 and config.server.api_keys == ("k",)


def test_a_flag_wins_over_the_config_file(tmp_path: Path) -> None:
    cfg = load_config("qwen2.5-coder-0.5b.json")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    data = config_data(args("-C", str(path), "--parallel", "3", "-m", "/other.gguf"))
    assert data["model"]["n_seq_max"] == 3 and data["model"]["path"] == "/other.gguf"
    assert data["model"]["n_ctx"] == cfg["model"]["n_ctx"]  # the rest is the file's


def test_nothing_to_serve_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"-m model\.gguf"):
        config_data(args("--port", "1"))


def test_print_config_round_trips() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "server.py"), "-m", "/x.gguf", "-c",
                          "1024", "--print-config"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    data = json.loads(out)
    assert data == {"model": {"path": "/x.gguf", "n_ctx": 1024}}
    validate(data)  # the printed config is valid against the published schema
    bad = subprocess.run([sys.executable, str(ROOT / "server.py"), "-m", "/x.gguf",
                          "--log-level", "loud"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "server.log_level" in bad.stderr


def test_serves_a_model_from_one_flag() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-m",
                             require_model("qwen-0.5b"), "--port", str(port), "-c", "2048",
                             "-np", "2", "-a", "quick"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["quick"]
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                        max_retries=0)
        r = client.completions.create(model="quick", prompt="def add(a, b):", max_tokens=4)
        assert r.model == "quick" and r.choices[0].text
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_config_may_name_its_schema() -> None:
    cfg = load_config("qwen2.5-coder-0.5b.json")
    validate({"$schema": "../engine/config.schema.json", **cfg})


def test_pull_is_a_product_command() -> None:
    """The README's model fetch: already cached, it prints where the models are."""
    out = subprocess.run([sys.executable, str(ROOT / "server.py"), "pull", "gemma",
                          "qwen-0.5b"], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.split() == [require_model("gemma"), require_model("qwen-0.5b")]
    bad = subprocess.run([sys.executable, str(ROOT / "server.py"), "pull", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "choose from" in bad.stderr


def test_check_validates_without_serving(tmp_path: Path) -> None:
    def check(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ROOT / "server.py"), "check", *argv],
                              capture_output=True, text=True, timeout=120)

    good = tmp_path / "good.json"
    cfg = load_config("qwen2.5-coder-0.5b.json")
    cfg["model"]["path"] = require_model("qwen-0.5b")
    good.write_text(json.dumps(cfg))
    ok = check("-C", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "architecture qwen2" in ok.stdout and "config ok" in ok.stdout
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({**cfg, "model": {**cfg["model"], "n_ctxx": 5}}))
    bad = check("-C", str(typo))
    assert bad.returncode == 2 and "model.n_ctxx" in bad.stderr
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"hello, not a model")
    broken = check("-m", str(not_gguf))
    assert broken.returncode == 1 and len(broken.stderr.strip().splitlines()) == 1
    missing = check("-m", str(tmp_path / "none.gguf"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    # -m alone: the family its chat template's markup is (issue 46)
    family = check("-m", require_model("qwen-0.5b"))
    assert family.returncode == 0, family.stderr
    assert "read as the hermes family" in family.stdout

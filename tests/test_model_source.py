"""from_pretrained against a pre-populated Hugging Face cache, offline; start-up failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import ROOT, gemma_config, require_model, start_server

REPO = "llamaserve-test/gemma-3-270m-GGUF"
FILE = "gemma-3-270m-q4_k_m.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_hf_cache(cache: Path) -> None:
    """The layout huggingface-hub writes: blobs, refs/main, snapshots/<commit>/<file>."""
    repo_dir = cache / ("models--" + REPO.replace("/", "--"))
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    blob = repo_dir / "blobs" / "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    blob.symlink_to(require_model("gemma"))
    snap = repo_dir / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / FILE).symlink_to(os.path.relpath(blob, snap))


@pytest.mark.parametrize("filename", [FILE, "*q4_k_m.gguf"])
def test_from_pretrained_offline(tmp_path: Path, filename: str) -> None:
    populate_hf_cache(tmp_path / "hf")
    cfg = gemma_config()
    del cfg["model"]["path"]
    cfg["model"]["from_pretrained"] = {"repo_id": REPO, "filename": filename,
                                       "cache_dir": str(tmp_path / "hf")}
    server = start_server(cfg, tmp_path, env={"HF_HUB_OFFLINE": "1"})
    try:
        # not a terminal: no progress bars, one line per file
        assert "model.from_pretrained: getting" in server.log()
        assert f"{FILE} (241.4 MiB) ready after" in server.log()
        models = httpx.get(f"{server.base_url}/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["gemma-3-270m"]
        r = httpx.post(f"{server.base_url}/completions", json={
            "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0},
            timeout=60).json()
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["model"] == "gemma-3-270m"
    finally:
        server.stop()


def run_server(cfg_path: Path,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "server.py"), "-C", str(cfg_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_missing_repo_offline_is_a_clear_start_error(tmp_path: Path) -> None:
    import json

    cfg = gemma_config()
    del cfg["model"]["path"]
    cfg["model"]["from_pretrained"] = {"repo_id": "nobody/nothing", "filename": "x.gguf",
                                       "cache_dir": str(tmp_path / "empty")}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    proc = run_server(path, {"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1
    assert "model.from_pretrained: cannot get nobody/nothing/x.gguf" in proc.stderr


def test_unloadable_model_file_exits_nonzero(tmp_path: Path) -> None:
    import json

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 100)
    cfg = gemma_config(path=str(junk))
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    proc = run_server(path)
    assert proc.returncode == 1
    assert "is not a GGUF file" in proc.stderr


def broken_hf_cache(tmp_path: Path) -> dict[str, str]:
    """A cache whose snapshot link points at a blob that is gone."""
    populate_hf_cache(tmp_path / "hf")
    for blob in (tmp_path / "hf").rglob("blobs/*"):
        blob.unlink()
    return {"repo_id": REPO, "filename": FILE, "cache_dir": str(tmp_path / "hf")}


def unreadable_hf_cache(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "hf-file").write_text("a file where the cache directory should be")
    return {"repo_id": REPO, "filename": FILE, "cache_dir": str(tmp_path / "hf-file")}


def truncated(tmp_path: Path) -> str:
    path = tmp_path / "truncated.gguf"
    with open(require_model("gemma"), "rb") as f:
        path.write_bytes(f.read(3_000_000))
    return str(path)


def cut_header(tmp_path: Path) -> str:
    path = tmp_path / "header.gguf"
    with open(require_model("gemma"), "rb") as f:
        path.write_bytes(f.read(100))
    return str(path)


def file_with(name: str, data: bytes) -> Any:
    def make(tmp_path: Path) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)
    return make


@pytest.mark.parametrize("source,expected", [
    (truncated, "is truncated"),
    (cut_header, "is truncated"),
    (file_with("text.gguf", b"hello, not a model\n"), "is not a GGUF file"),
    (file_with("empty.gguf", b""), "is not a GGUF file"),
    (file_with("v9.gguf", b"GGUF\x09\x00\x00\x00" + b"\x00" * 16), "unsupported GGUF version"),
    (lambda tmp: str(tmp / "missing.gguf"), "no such file"),
    (lambda tmp: str(tmp), "no such file"),  # a directory
    (broken_hf_cache, "cannot get"),
    (unreadable_hf_cache, "cannot get"),
])
def test_bad_model_sources_exit_1_with_one_clear_line(tmp_path: Path, source: Any,
                                                       expected: str) -> None:
    cfg = gemma_config()
    value = source(tmp_path)
    if isinstance(value, dict):
        del cfg["model"]["path"]
        cfg["model"]["from_pretrained"] = value
    else:
        cfg["model"]["path"] = value
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    proc = run_server(path, {"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    lines = [ln for ln in output.splitlines() if ln.startswith("llamaserve: cannot start:")]
    assert len(lines) == 1 and expected in lines[0], output[-2000:]
    assert "Traceback" not in output

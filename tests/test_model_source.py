"""from_pretrained against a pre-populated Hugging Face cache, offline; start-up failures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert "could not load the model file" in proc.stderr

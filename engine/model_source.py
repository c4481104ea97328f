"""Resolve the config's model source to a local GGUF path.

``path`` is used as is; ``from_pretrained`` goes through huggingface-hub, which
also works offline (``HF_HUB_OFFLINE=1``) against an already populated cache.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from engine.config import FromPretrained, ModelConfig

_GLOB_CHARS = set("*?[")


class ModelSourceError(RuntimeError):
    pass


def resolve(cfg: ModelConfig) -> str:
    if cfg.path is not None:
        if not os.path.isfile(cfg.path):
            raise ModelSourceError(f"model.path: no such file: {cfg.path}")
        return cfg.path
    assert cfg.from_pretrained is not None
    return download(cfg.from_pretrained)


def download(src: FromPretrained) -> str:
    """Fetch (or find in the cache) the GGUF and its additional files; return the GGUF path."""
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise ModelSourceError(f"huggingface-hub is required for from_pretrained: {exc}") from exc
    try:
        if not (_GLOB_CHARS & set(src.filename)) and not any(
            _GLOB_CHARS & set(f) for f in src.additional_files
        ):
            for extra in src.additional_files:
                hf_hub_download(src.repo_id, extra, revision=src.revision,
                                cache_dir=src.cache_dir)
            return str(hf_hub_download(src.repo_id, src.filename, revision=src.revision,
                                       cache_dir=src.cache_dir))
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
    return str(matches[0])

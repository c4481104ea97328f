"""Ollama model names (``model:tag``) → the configured models.

Ollama clients send what ``/api/tags`` listed (``qwen2.5-coder-0.5b-instruct:latest``) or
what a user typed (``qwen2.5-coder``, ``smollm2:latest``). A name is tried as it is, then
without its ``:tag``, then with ``:latest``; an alias or a LoRA adapter's name matches
(an adapter routes to its model and applies it). Nothing else matches: unlike the OpenAI
routes of a one-model server, an unknown name is a 404, as Ollama answers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.web.errors import APIError
from api.web.registry import ModelRegistry

LATEST = "latest"


def split_tag(name: str) -> tuple[str, str | None]:
    """``("qwen", "0.5b")`` for ``qwen:0.5b``; a colon inside the namespace part
    (``host:port/model``) is not a tag."""
    base, sep, tag = name.rpartition(":")
    if not sep or not base or "/" in tag:
        return name, None
    return base, tag


def listed_name(alias: str) -> str:
    """The name ``/api/tags`` shows: the alias, with ``:latest`` when it has no tag."""
    return alias if split_tag(alias)[1] is not None else f"{alias}:{LATEST}"


@dataclass(frozen=True)
class Resolved:
    entry: str  # the model's registry entry (its served name)
    matched: str  # the configured name that matched (the alias, or an adapter's name)


def candidates(name: str) -> list[str]:
    base, tag = split_tag(name)
    out = [name]
    if tag is not None:
        out.append(base)
    else:
        out.append(f"{name}:{LATEST}")
    return out


def resolve(registry: ModelRegistry, name: Any) -> Resolved:
    """The configured model an Ollama request names; 400 without a name, 404 for a name
    no model or adapter has."""
    if name is None or name == "":
        raise APIError("model is required", param="model")
    if not isinstance(name, str):
        raise APIError("'model' must be a string", param="model")
    for candidate in candidates(name):
        if candidate in registry.entries:
            return Resolved(candidate, candidate)
        if candidate in registry.adapters:
            return Resolved(registry.adapters[candidate], candidate)
    raise APIError(f"model '{name[:200]}' not found", status=404, param="model",
                   code="model_not_found")

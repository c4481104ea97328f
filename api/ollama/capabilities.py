"""What a loaded model can do, in Ollama's words (``/api/show``'s ``capabilities``), and
the facts Ollama's listings give about it (``details``)."""

from __future__ import annotations

import re
from typing import Any

from api.web.state import ModelState

# the quantization in a GGUF file's name (Ollama's quantization_level), e.g. "...-q4_k_m.gguf"
_QUANT = re.compile(r"(?:^|[-_.])(i?q\d(?:_[0-9a-z]+)*|f16|f32|bf16)(?=[-_.]|$)", re.I)


def thinks(state: ModelState) -> bool:
    """Its template reasons: the response schema has reasoning markers, or the template
    takes ``enable_thinking``."""
    lay = state.layout
    source = state.template.source if state.template is not None else ""
    if "enable_thinking" in source:
        return True
    if not (lay.reasoning_start and lay.reasoning_end):
        return False
    # a family read from the template (Qwen2.5 shares Qwen3's markup): only if the template
    # itself writes the reasoning block
    return not lay.name or lay.reasoning_end in source


def capabilities(state: ModelState) -> list[str]:
    model = state.model
    out = []
    if not model.embedding_only:
        out.append("completion")
        source = state.template.source if state.template is not None else ""
        lay = state.layout
        # call markup (a config's schema or the family read from the template), or a
        # template that takes tools and no schema saying it writes none
        if lay.call_start or lay.block_start or lay.shape is not None or (
                "tools" in source and not state.model_config.response_schema):
            out.append("tools")
        if model.fim_tokens() is not None:
            out.append("insert")
        if thinks(state):
            out.append("thinking")
    if model.embeddings is not None:
        out.append("embedding")
    media = model.media
    if media is not None and media.vision:
        out.append("vision")
    if media is not None and media.audio:
        out.append("audio")
    return out


def quantization(path: str | None) -> str:
    """The quantization named in the file's name ("Q4_K_M"), or "" when it names none."""
    found = _QUANT.findall((path or "").rsplit("/", 1)[-1])
    return found[-1].upper() if found else ""


def details(path: str | None, parent: str = "") -> dict[str, Any]:
    """Ollama's ``details``. Family and parameter size are left empty: llamaserve does not
    read them from the GGUF for its listings."""
    return {"parent_model": parent, "format": "gguf", "family": "", "families": [],
            "parameter_size": "", "quantization_level": quantization(path)}

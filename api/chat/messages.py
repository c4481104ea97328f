"""Chat messages: validation, OpenAI -> template shape, and prompt rendering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from api.web.body import BodyLimits, decode
from api.web.errors import APIError, invalid
from api.web.params import Body
from engine.constraints.lark_rules import CUSTOM_GRAMMAR

if TYPE_CHECKING:
    from api.media.parts import MediaRefs
from engine.handle import ModelHandle
from parsers.chat_template import ChatTemplate

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
MAX_MESSAGES = 4096


TEXT_PARTS = ("text", "input_text", "output_text", "summary_text", "reasoning_text")
MEDIA_PARTS = {"image_url": "image", "input_image": "image", "input_audio": "audio",
               "audio_url": "audio", "file": "file", "input_file": "file"}


def part_text(part: Any, where: str, media: MediaRefs | None = None) -> str:
    """One content part of any API (chat, Responses) as prompt text. With ``media`` (the
    model has a projector), images and audio become this request's markers; otherwise
    media become a short placeholder naming what was left out, never a 400."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise invalid(where, "content parts must be objects with a 'type'")
    kind = part["type"]
    if kind in TEXT_PARTS:
        if not isinstance(part.get("text"), str):
            raise invalid(f"{where}.text", f"'{kind}' parts need a string 'text'")
        return str(part["text"])
    if kind == "refusal":
        return str(part.get("refusal") or "")
    if media is not None:
        marker = media.add(part, where)
        if marker is not None:
            return marker
    if kind in MEDIA_PARTS:
        name = part.get("filename") or (part.get("file") or {}).get("filename") \
            if isinstance(part.get("file", {}), dict) else None
        what = MEDIA_PARTS[kind] + (f" {name}" if isinstance(name, str) and name else "")
        return f"[{what} omitted: this model does not read it]"
    raise invalid(where, f"content part type {kind!r} is not supported")


def content_text(content: Any, where: str, media: MediaRefs | None = None) -> str:
    """A string, or a list of parts joined as llama.cpp joins them (common/chat.cpp): a
    newline between text parts, none before or after a media marker, so an image request
    renders, counts and caches as llama-server's does."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "'content' must be a string or a list of parts")
    text = ""
    after_media = False
    for i, p in enumerate(content):
        before = len(media.refs) if media is not None else 0
        piece = part_text(p, f"{where}[{i}]", media)
        is_media = media is not None and len(media.refs) > before
        if text and not is_media and not after_media:
            text += "\n"
        text += piece
        after_media = is_media
    return text


def has_media(content: Any) -> bool:
    """Whether a list of content parts holds an image or audio part."""
    return isinstance(content, list) and any(
        isinstance(p, dict) and MEDIA_PARTS.get(str(p.get("type"))) in ("image", "audio")
        for p in content)


def _content(message: dict[str, Any], where: str, media: MediaRefs | None) -> str | None:
    content = message.get("content")
    if content is None:
        return None
    return content_text(content, f"{where}.content", media)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI sends arguments as a JSON string; chat templates expect an object."""
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", "'tool_calls' must be a list")
    out = []
    for i, call in enumerate(calls):
        custom = call.get("custom") if isinstance(call, dict) else None
        if isinstance(call, dict) and call.get("type") == "custom" and isinstance(custom, dict):
            # a custom tool's call: its input as the one argument the tool was offered with
            name, text = custom.get("name"), custom.get("input", "")
            if not isinstance(name, str) or not isinstance(text, str):
                raise invalid(f"{where}.tool_calls[{i}].custom",
                              "a custom tool call needs a 'name' and a string 'input'")
            call = {k: v for k, v in call.items() if k != "custom"}
            out.append({**call, "type": "function",
                        "function": {"name": name, "arguments": {"input": text}}})
            continue
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{where}.tool_calls[{i}]",
                          "each tool call needs a 'function' with a 'name'")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = decode(args, BodyLimits()) if args.strip() else {}
            except APIError as exc:  # the body's limits apply inside the string too
                raise invalid(f"{where}.tool_calls[{i}].function.arguments",
                              f"'arguments' must be a JSON object string ({exc.message})") \
                    from None
        out.append({**call, "type": call.get("type", "function"),
                    "function": {**fn, "arguments": args}})
    return out


def parse_messages(body: Body, media: MediaRefs | None = None) -> list[dict[str, Any]]:
    raw = body.data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty list")
    if len(raw) > MAX_MESSAGES:
        raise invalid("messages", f"at most {MAX_MESSAGES} messages are allowed")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, "each message must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role", f"unknown role {role!r}")
        message = {**m, "content": _content(m, where, media)}
        if isinstance(m.get("reasoning"), str) and "reasoning_content" not in m:
            # vLLM's and OpenRouter's name for it: templates read reasoning_content
            message["reasoning_content"] = message.pop("reasoning")
        if m.get("tool_calls"):
            message["tool_calls"] = _tool_calls(m["tool_calls"], where)
        elif message["content"] is None:
            if role != "assistant":
                raise invalid(f"{where}.content", "'content' is required")
            message["content"] = ""
        out.append(message)
    return out


def _shown(tools: list[Any] | None) -> list[Any] | None:
    """The tools as the template shows them: a custom tool's grammar is in its description
    already, not repeated inside its parameters (``api.responses.request``)."""
    if not tools:
        return tools
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(fn, dict) and isinstance(params, dict) and isinstance(props, dict) and \
                any(isinstance(p, dict) and CUSTOM_GRAMMAR in p for p in props.values()):
            props = {k: {a: b for a, b in p.items() if a != CUSTOM_GRAMMAR}
                     if isinstance(p, dict) else p for k, p in props.items()}
            tool = {**tool, "function": {**fn, "parameters": {**params, "properties": props}}}
        out.append(tool)
    return out


# variables the server passes to every template itself: a request may not set them
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt")


def template_kwargs(body: Body) -> dict[str, Any]:
    """The template variables a chat body sets: ``chat_template_kwargs``, and
    ``reasoning_effort`` unless those set it; a 400 names a variable the server sets."""
    extra = dict(body.obj("chat_template_kwargs") or {})
    taken = [k for k in RESERVED_TEMPLATE_VARIABLES if k in extra]
    if taken:
        raise invalid("chat_template_kwargs", f"'chat_template_kwargs' may not set "
                      f"{', '.join(repr(k) for k in taken)}: the server passes "
                      f"{', '.join(RESERVED_TEMPLATE_VARIABLES)} to the template itself")
    if body.has("reasoning_effort"):
        extra.setdefault("reasoning_effort", body.string("reasoning_effort"))
    return extra


def render(model: ModelHandle, template: ChatTemplate, messages: list[dict[str, Any]],
           tools: list[Any] | None, extra: dict[str, Any]) -> tuple[str, list[int]]:
    """The rendered prompt text and its tokens (BOS added if the template did not)."""
    text = template.render(messages, tools=_shown(tools), add_generation_prompt=True, **extra)
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    bos = model.special_token_text("bos")
    if model.adds_bos and bos and not text.startswith(bos):
        tokens = [model.bos_token, *tokens]
    return text, tokens


def render_prompt(model: ModelHandle, template: ChatTemplate, messages: list[dict[str, Any]],
                  tools: list[Any] | None, extra: dict[str, Any]) -> list[int]:
    return render(model, template, messages, tools, extra)[1]

"""Ollama's chat messages and generate prompts, translated to chat messages.

A message is ``{role, content, images?, thinking?, tool_calls?, tool_name?}``: ``images``
(base64) become image parts after the text — the model's projector reads them, or, without
one, they become the same placeholder as in every other API; ``thinking`` is the
assistant's earlier reasoning (``reasoning_content``); ``tool_calls`` carry ``arguments``
as an object (a JSON string is accepted too); a ``tool`` message's ``tool_name`` is also
given to the template as ``name``. ``/api/generate`` is one user turn (after ``system``).
The result then goes through ``api.chat.messages.parse_messages`` like chat's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from api.ollama.names import Resolved, resolve
from api.ollama.options import check_keep_alive, stream_flag
from api.ollama.timings import Timings
from api.web.errors import invalid
from api.web.params import Body, read_json
from api.web.state import ModelState, ServerState

MAX_IMAGES = 64  # per message or prompt; model.mtmd.max_media_per_request limits further


@dataclass
class Incoming:
    """What ``/api/chat`` and ``/api/generate`` read first: the body, the model it names
    (resolved, not yet loaded), ``stream`` and ``keep_alive`` checked, the clock started."""

    request: Request
    server: ServerState
    body: Body
    resolved: Resolved
    name: str  # as the client wrote it: answers carry it back
    stream: bool
    timings: Timings

    async def model(self) -> ModelState:
        """The named model, loaded (after the rest of the body is validated)."""
        state = await self.server.registry.acquire(self.resolved.entry, self.request.scope)
        self.timings.model_ready()
        return state


async def incoming(request: Request) -> Incoming:
    timings = Timings()
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    resolved = resolve(server.registry, body.data.get("model"))
    stream = stream_flag(body)
    check_keep_alive(body.data.get("keep_alive"))
    return Incoming(request, server, body, resolved, str(body.data["model"]), stream, timings)


def images(raw: Any, where: str) -> list[dict[str, Any]]:
    """Base64 images → chat image parts (the bytes are read and sniffed later, on the
    media path; the declared type of a data: URL is not used)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_IMAGES:
        raise invalid(where, f"'images' must be a list of at most {MAX_IMAGES} base64 "
                      "strings")
    parts = []
    for i, image in enumerate(raw):
        if not isinstance(image, str) or not image:
            raise invalid(f"{where}[{i}]", "each image must be a non-empty base64 string")
        url = image if image[:5].lower() == "data:" else f"data:image/png;base64,{image}"
        parts.append({"type": "image_url", "image_url": {"url": url}, "_where": f"{where}[{i}]"})
    return parts


def content(text: str, parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    return [{"type": "text", "text": text}, *parts] if parts else text


def _tool_calls(raw: Any, where: str, turn: int) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise invalid(where, "'tool_calls' must be a list")
    out = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"{where}[{j}]", "each tool call needs a 'function' with a 'name'")
        args = fn.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, (dict, str)):
            raise invalid(f"{where}[{j}].function.arguments", "'arguments' must be an object")
        call_id = call.get("id")
        out.append({"id": call_id if isinstance(call_id, str) and call_id
                    else f"call_{turn}_{j}",
                    "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def message(i: int, raw: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise invalid(where, "each message must be an object")
    role = raw.get("role")
    if not isinstance(role, str):
        raise invalid(f"{where}.role", "each message needs a 'role'")
    role = role.lower()  # as Ollama reads it
    text = raw.get("content")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise invalid(f"{where}.content", "'content' must be a string")
    out: dict[str, Any] = {"role": role,
                           "content": content(text, images(raw.get("images"),
                                                           f"{where}.images"))}
    thinking = raw.get("thinking")
    if role == "assistant" and isinstance(thinking, str) and thinking:
        out["reasoning_content"] = thinking
    if raw.get("tool_calls"):
        out["tool_calls"] = _tool_calls(raw["tool_calls"], f"{where}.tool_calls", i)
    for name in ("tool_name", "tool_call_id"):
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid(f"{where}.{name}", f"'{name}' must be a string")
        if value:
            out[name] = value
    if role == "tool" and out.get("tool_name"):
        out.setdefault("name", out["tool_name"])
    return out


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    """``messages`` → chat messages ([] when there are none: a request that only loads the
    model)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("messages", "'messages' must be a list")
    return [message(i, m) for i, m in enumerate(raw)]


def generate_messages(prompt: str, system: str, image_parts: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """``/api/generate``'s prompt as a conversation: the system message, one user turn."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    return [*out, {"role": "user", "content": content(prompt, image_parts)}]

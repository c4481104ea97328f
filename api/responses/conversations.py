"""The Conversations API (``/v1/conversations`` and its items), on the Responses store.

A conversation is a list of items (messages, calls, their outputs, reasoning) with an id
and metadata. A response created with ``conversation: <id>`` reads the conversation's
items as its history, and once it finishes its input and output items are added to it,
so the next response continues from there. Conversations live in the same store as
responses (``server.responses_store_path`` on disk, or memory), bounded the same way.
Two responses running at once on one conversation each add their items; the second to
finish is the later in the list.
"""

from __future__ import annotations

import os
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.responses.items import page, resource_items
from api.responses.request import input_messages
from api.responses.store import ResponseStore, StoredResponse
from api.web.errors import APIError, invalid
from api.web.params import Body, read_json
from api.web.state import ServerState

PREFIX = "conv_"
MAX_ITEMS_PER_CALL = 20  # OpenAI's bound on items added in one call
MAX_METADATA = 16


def _not_found(conversation_id: str, param: str = "conversation_id") -> APIError:
    return APIError(f"Conversation with id '{conversation_id[:200]}' not found.",
                    status=404, param=param, code="not_found")


async def _load(store: ResponseStore, conversation_id: str,
                param: str = "conversation_id") -> StoredResponse:
    stored = await store.get(conversation_id) if conversation_id.startswith(PREFIX) \
        else None
    if stored is None or stored.response.get("object") != "conversation":
        raise _not_found(conversation_id, param)
    return stored


async def conversation_items(store: ResponseStore, conversation_id: str
                             ) -> list[dict[str, Any]]:
    """A conversation's items, oldest first (a response's history)."""
    return (await _load(store, conversation_id, "conversation")).items


async def add_items(store: ResponseStore, conversation_id: str,
                    items: list[dict[str, Any]]) -> None:
    """Add a finished response's items to its conversation (gone: nothing to add to)."""
    stored = await store.get(conversation_id)
    if stored is None or stored.response.get("object") != "conversation":
        return
    await store.put(stored.response, [], [*stored.items, *items])


def _metadata(body: Body) -> dict[str, str]:
    metadata = body.obj("metadata") or {}
    if len(metadata) > MAX_METADATA or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in metadata.items()):
        raise invalid("metadata", f"'metadata' holds at most {MAX_METADATA} string pairs "
                      "(keys up to 64 characters, values up to 512)")
    return metadata


def _items(body: Body, required: bool) -> list[dict[str, Any]]:
    raw = body.data.get("items")
    if raw is None and not required:
        return []
    if not isinstance(raw, list) or (required and not raw):
        raise invalid("items", "'items' must be a list of items")
    if len(raw) > MAX_ITEMS_PER_CALL:
        raise invalid("items", f"at most {MAX_ITEMS_PER_CALL} items can be added at once")
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise invalid(f"items[{i}]", "each item must be an object")
    input_messages(raw)  # the checks a response's input gets (roles, calls, content parts)
    return resource_items(raw)


async def create_conversation(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    conversation = {"id": PREFIX + os.urandom(16).hex(), "object": "conversation",
                    "created_at": int(time.time()), "metadata": _metadata(body)}
    await server.responses.put(conversation, [], _items(body, required=False))
    return JSONResponse(conversation)


async def get_conversation(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    stored = await _load(server.responses, request.path_params["conversation_id"])
    return JSONResponse(stored.response)


async def update_conversation(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    stored = await _load(server.responses, request.path_params["conversation_id"])
    body = Body(await read_json(request, server.body_limits))
    if "metadata" not in body.data:
        raise invalid("metadata", "'metadata' is required")
    conversation = {**stored.response, "metadata": _metadata(body)}
    await server.responses.put(conversation, [], stored.items)
    return JSONResponse(conversation)


async def delete_conversation(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    conversation_id = request.path_params["conversation_id"]
    await _load(server.responses, conversation_id)
    await server.responses.delete(conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted",
                         "deleted": True})


async def list_items(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    stored = await _load(server.responses, request.path_params["conversation_id"])
    return JSONResponse(page(stored.items, request.query_params))


async def create_items(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    stored = await _load(server.responses, request.path_params["conversation_id"])
    body = Body(await read_json(request, server.body_limits))
    added = _items(body, required=True)
    await server.responses.put(stored.response, [], [*stored.items, *added])
    return JSONResponse({"object": "list", "data": added, "first_id": added[0]["id"],
                         "last_id": added[-1]["id"], "has_more": False})


def _find(stored: StoredResponse, item_id: str) -> int:
    for i, item in enumerate(stored.items):
        if item.get("id") == item_id:
            return i
    raise APIError(f"Item with id '{item_id[:200]}' not found.", status=404,
                   param="item_id", code="not_found")


async def get_item(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    stored = await _load(server.responses, request.path_params["conversation_id"])
    return JSONResponse(stored.items[_find(stored, request.path_params["item_id"])])


async def delete_item(request: Request) -> Response:
    """Remove one item; the answer is the conversation, as OpenAI's is."""
    server: ServerState = request.app.state.llama
    stored = await _load(server.responses, request.path_params["conversation_id"])
    index = _find(stored, request.path_params["item_id"])
    await server.responses.put(stored.response, [],
                               stored.items[:index] + stored.items[index + 1:])
    return JSONResponse(stored.response)


CONVERSATION_ROUTES = [
    Route("/v1/conversations", create_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", get_conversation, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}", update_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", delete_conversation, methods=["DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", list_items, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items", create_items, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", get_item, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", delete_item,
          methods=["DELETE"]),
]

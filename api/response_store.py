"""Stored responses: bounded by count, bytes and age (least recently stored goes first)."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object as returned
    conversation: list[dict[str, Any]]  # chat messages through this response's output
    size: int
    stored_at: float


class ResponseStore:
    def __init__(self, max_items: int, max_bytes: int, ttl: float) -> None:
        self.max_items, self.max_bytes, self.ttl = max_items, max_bytes, ttl
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if size > self.max_bytes or self.max_items <= 0:
            return
        self.delete(response["id"])
        self._items[response["id"]] = StoredResponse(response, conversation, size, time.time())
        self._bytes += size
        while len(self._items) > self.max_items or self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.size

    def get(self, response_id: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is not None and self.ttl > 0 and time.time() - item.stored_at > self.ttl:
            self.delete(response_id)
            return None
        return item

    def delete(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is None:
            return False
        self._bytes -= item.size
        return True

    def __len__(self) -> int:
        return len(self._items)

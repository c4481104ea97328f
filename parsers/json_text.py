"""``json.loads`` for JSON inside text (what a model wrote, a tool call's ``arguments``
string): every failure is a ``ValueError`` — nesting past the recursion limit included —
and strings holding an unpaired surrogate or NUL are refused as well, since they cannot
be encoded back to UTF-8 when the result is sent."""

from __future__ import annotations

import json
import re
from typing import Any

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def loads(text: str) -> Any:
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _BAD_TEXT.search(node):
                raise ValueError("JSON string holds an unpaired surrogate or NUL")
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return value


def custom_input(arguments: str) -> str:
    """A custom (freeform) tool's input, from its call's ``arguments``: the one string
    ``input`` the tool is offered with as a function (``api.chat.tools``), or the arguments
    as written when they are not that."""
    try:
        value = loads(arguments)
    except ValueError:
        return arguments
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments

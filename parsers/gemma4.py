"""Gemma 4's tool-call values: ``call:NAME{key:value,...}`` as its chat template writes
them (``format_argument`` with ``escape_keys=False``): object keys bare, strings between
``<|"|>`` tokens, numbers, ``true`` / ``false`` / ``null`` as in JSON, arrays in ``[]``.

``parse_value`` reads one such value into Python (None when it is not one, like bad JSON),
``dumps`` writes one (the grammar's tests and the bench compare against it).
"""

from __future__ import annotations

import json
import re
from typing import Any

QUOTE = '<|"|>'  # Gemma 4's string delimiter (one control token)
MAX_DEPTH = 64  # nesting read before the value is refused (the grammar never nests deeper)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_KEY = re.compile(r"\s*([^:{}\[\],<\s][^:{}\[\],<]*?)\s*:")
_WORDS = {"true": True, "false": False, "null": None}


class _Bad(ValueError):
    pass


def parse_value(text: str) -> Any:
    """The value ``text`` holds, whole (surrounding whitespace allowed); None otherwise."""
    try:
        value, end = _value(text, _skip(text, 0), 0)
    except (_Bad, RecursionError):
        return None
    return value if _skip(text, end) == len(text) else None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise _Bad("too deep")
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise _Bad("unterminated string")
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("{", i):
        return _object(text, i + 1, depth)
    if text.startswith("[", i):
        return _array(text, i + 1, depth)
    m = _NUMBER.match(text, i)
    if m is not None:
        number = m.group(0)
        return float(number) if any(c in number for c in ".eE") else int(number), m.end()
    for word, word_value in _WORDS.items():
        if text.startswith(word, i):
            return word_value, i + len(word)
    raise _Bad(f"no value at {i}")


def _object(text: str, i: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = _skip(text, i)
    if text.startswith("}", i):
        return out, i + 1
    while True:
        key: str
        if text.startswith(QUOTE, i):  # escape_keys=True writes keys as strings
            key, i = _value(text, i, depth + 1)
            i = _skip(text, i)
            if not text.startswith(":", i):
                raise _Bad("no ':' after a key")
            i += 1
        else:
            m = _KEY.match(text, i)
            if m is None:
                raise _Bad(f"no key at {i}")
            key, i = m.group(1), m.end()
        out[key], i = _value(text, _skip(text, i), depth + 1)
        i = _skip(text, i)
        if text.startswith("}", i):
            return out, i + 1
        if not text.startswith(",", i):
            raise _Bad(f"no ',' or '}}' at {i}")
        i = _skip(text, i + 1)


def _array(text: str, i: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(text, i)
    if text.startswith("]", i):
        return out, i + 1
    while True:
        value, i = _value(text, _skip(text, i), depth + 1)
        out.append(value)
        i = _skip(text, i)
        if text.startswith("]", i):
            return out, i + 1
        if not text.startswith(",", i):
            raise _Bad(f"no ',' or ']' at {i}")
        i += 1


def dumps(value: Any) -> str:
    """``value`` as the template's ``format_argument(value, escape_keys=False)`` writes it
    (keys sorted, as its ``dictsort`` does)."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{dumps(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)

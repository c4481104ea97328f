"""The one way request bodies are decoded: HTTP bodies and WebSocket frames alike.

A body is strict JSON (RFC 8259) in UTF-8, and it must stay within the ``server``
limits before any handler sees it:

- nesting depth (``max_json_depth``), string length in characters
  (``max_string_length``), items of an array or members of an object
  (``max_array_length``), characters of a number literal (``max_number_length``);
- no ``NaN`` / ``Infinity`` (not JSON) and no number that overflows a double;
- no duplicated key in an object;
- no unpaired UTF-16 surrogate (``"\\ud83d"``) and no NUL (``"\\u0000"``) in any string,
  key or value: these are **refused**, never replaced, since llama.cpp's tokenizer and
  every text encoder downstream need real Unicode text.

Every refusal is an ``APIError`` 400 (``code`` names the class, ``param`` the JSON path
or the limit), so a body the JSON grammar accepts or rejects never reaches a handler in
a shape that can raise anything else. Decoding never recurses in Python beyond what
``json.loads`` does itself, and a ``RecursionError`` from it is a depth refusal.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from api.web.errors import APIError

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int = 8 * 1024 * 1024
    max_depth: int = 64
    max_string: int = 4 * 1024 * 1024
    max_items: int = 262_144
    max_number: int = 100
    timeout: float = 30.0  # seconds to receive an HTTP body


def too_large(limit: int) -> APIError:
    return APIError(f"Request body too large (limit {limit} bytes)", status=413,
                    code="request_too_large", param="max_body_bytes")


def _refuse(message: str, code: str, param: str | None) -> APIError:
    return APIError(message, code=code, param=param)


class _Decoder:
    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self.decoder = json.JSONDecoder(object_pairs_hook=self.obj, parse_int=self.int,
                                        parse_float=self.float, parse_constant=self.constant)

    def number_length(self, text: str) -> None:
        if len(text) > self.limits.max_number:
            raise _refuse(f"A number in the body has {len(text)} characters (limit "
                          f"max_number_length = {self.limits.max_number})", "number_too_long",
                          "max_number_length")

    def int(self, text: str) -> int:
        self.number_length(text)
        return int(text)

    def float(self, text: str) -> float:
        self.number_length(text)
        value = float(text)
        if not math.isfinite(value):
            raise _refuse(f"The number {text[:40]} is out of range", "number_out_of_range",
                          None)
        return value

    @staticmethod
    def constant(text: str) -> Any:
        raise _refuse(f"{text} is not valid JSON", "invalid_json", None)

    def obj(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len(pairs) > self.limits.max_items:
            raise _refuse(f"An object in the body has {len(pairs)} members (limit "
                          f"max_array_length = {self.limits.max_items})", "too_many_items",
                          "max_array_length")
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise _refuse(f"Duplicated key {json.dumps(key)[:60]} in an object",
                                  "duplicate_key", _safe(key))
                seen.add(key)
        return out

    def decode(self, text: str) -> Any:
        try:
            return self.decoder.decode(text)
        except json.JSONDecodeError as exc:
            raise _refuse(f"Invalid JSON body: {exc}", "invalid_json", None) from None
        except RecursionError:
            raise self.too_deep() from None

    def too_deep(self) -> APIError:
        return _refuse(f"The body nests deeper than max_json_depth = {self.limits.max_depth}",
                       "nesting_too_deep", "max_json_depth")


def _safe(text: str) -> str:
    """Text fit for an error message: bad code points escaped, at most 60 characters."""
    return _BAD_TEXT.sub(lambda m: f"\\u{ord(m.group()):04x}", text[:60])


def _path(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{_safe(p)}" if out else _safe(p))
    return out or "<body>"


def _check_text(text: str, limits: BodyLimits, where: list[str | int]) -> None:
    if len(text) > limits.max_string:
        raise _refuse(f"A string at {_path(where)} has {len(text)} characters (limit "
                      f"max_string_length = {limits.max_string})", "string_too_long",
                      _path(where))
    bad = _BAD_TEXT.search(text)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else \
            f"an unpaired surrogate \\u{ord(bad.group()):04x}"
        raise _refuse(f"A string at {_path(where)} holds {what} at index {bad.start()}; "
                      "send valid Unicode text", "invalid_unicode", _path(where))


def check(value: Any, limits: BodyLimits) -> None:
    """Depth, array length, string length and text validity over a decoded value, with an
    explicit stack (no recursion). Each entry carries its path for the error message."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, where = stack.pop()
        if len(where) >= limits.max_depth:
            raise _refuse(f"The body nests deeper than max_json_depth = {limits.max_depth} "
                          f"(at {_path(where[:8])}...)", "nesting_too_deep", "max_json_depth")
        if type(node) is dict:
            for key, item in node.items():
                _check_text(key, limits, [*where, key])
                kind = type(item)
                if kind is str:
                    _check_text(item, limits, [*where, key])
                elif kind is dict or kind is list:
                    stack.append((item, [*where, key]))
        elif type(node) is list:
            if len(node) > limits.max_items:
                raise _refuse(f"An array at {_path(where)} has {len(node)} items (limit "
                              f"max_array_length = {limits.max_items})", "too_many_items",
                              "max_array_length")
            for i, item in enumerate(node):
                kind = type(item)
                if kind is str:
                    _check_text(item, limits, [*where, i])
                elif kind is dict or kind is list:
                    stack.append((item, [*where, i]))
        elif type(node) is str:
            _check_text(node, limits, where)


def decode(raw: bytes | str, limits: BodyLimits) -> Any:
    """Decode and check one body or frame; anything wrong is a 400/413 ``APIError``."""
    if len(raw) > limits.max_bytes:
        raise too_large(limits.max_bytes)
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(f"The body is not valid UTF-8 (byte {exc.start})", "invalid_json",
                          None) from None
    else:
        text = raw
    decoder = _Decoder(limits)
    value = decoder.decode(text)
    check(value, limits)
    return value


def decode_object(raw: bytes | str, limits: BodyLimits, what: str = "Request body") -> \
        dict[str, Any]:
    value = decode(raw, limits)
    if not isinstance(value, dict):
        raise _refuse(f"{what} must be a JSON object", "invalid_json", None)
    return value

"""How a model family writes its tool calls, as literal text around each call's name and
arguments: the one description the forced-call grammar (``engine/constraints/grammar_shapes.py``)
and the tests' renderings are built from.

    section_open  call_open NAME name_close ARGS call_close
                  [separator call_open NAME name_close ARGS call_close ...]  section_close

ARGS is one JSON object, or (``key_open`` set) key/value markup: for each argument
``key_open KEY key_close VALUE value_close``, a string value written bare, any other as
JSON. A ``{key}`` in ``value_close`` is the argument's key (MiniMax M3 closes each value
with a tag named after it: ``<city>Tokyo</city>``); a ``{type}`` in ``key_close_json`` is the
JSON type of the value (Kimi K3: ``type="number"``), an ``{index}`` in ``name_close`` the
call's position from 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallShape:
    call_open: str
    name_close: str
    call_close: str
    section_open: str = ""
    section_close: str = ""
    separator: str = ""
    key_open: str = ""  # key_open / key_close set: arguments as key/value markup
    key_close: str = ""
    value_close: str = ""
    key_close_json: str = ""  # after the key of a value written as JSON ("": key_close)
    json_values: bool = False  # every value as JSON, strings quoted (Python-style calls)
    single: bool = False  # the family writes one call per answer (GigaChat)

    @property
    def marker(self) -> str:
        """The text that starts the calls (a lazy grammar's trigger; "" when the family
        writes a bare JSON object)."""
        head = (self.section_open or self.call_open).strip()
        return "" if head.startswith("{") else head

    @property
    def pairs(self) -> bool:
        """Arguments as key / value markup (else one JSON object)."""
        return bool(self.key_open or self.key_close)

    @property
    def json_key_close(self) -> str:
        return self.key_close_json or self.key_close

    def typed_key_close(self, kind: str) -> str:
        """What follows the key of a value written as JSON of type ``kind``."""
        return self.json_key_close.replace("{type}", kind)

    def close_value(self, key: str) -> str:
        """What closes the value of argument ``key``."""
        return self.value_close.replace("{key}", key)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """The text of ``calls`` (name, arguments) as the family writes them."""
        parts = []
        for index, (name, args) in enumerate(calls, 1):
            if self.pairs:
                bare = [isinstance(v, str) and not self.json_values for v in args.values()]
                body = "".join(
                    f"{self.key_open}{key}"
                    f"{self.key_close if b else self.typed_key_close(json_type(value))}"
                    f"{value if b else json.dumps(value, ensure_ascii=False)}"
                    f"{self.close_value(key)}" for (key, value), b in zip(args.items(), bare,
                                                                      strict=True))
            else:
                body = json.dumps(args, ensure_ascii=False)
            head = self.name_close.replace("{index}", str(index))
            parts.append(f"{self.call_open}{name}{head}{body}{self.call_close}")
        return f"{self.section_open}{self.separator.join(parts)}{self.section_close}"


def json_type(value: Any) -> str:
    """The JSON type name of a Python value (integers and floats both "number")."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array"

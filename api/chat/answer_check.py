"""Every structured answer checked against its schema after generation.

A grammar guarantees the shape; this is the proof. When an answer ends normally (not cut
off by ``max_tokens`` or the context), its JSON content is validated against the
``response_format`` schema and each tool call's arguments against that tool's
``parameters`` (the ``jsonschema`` package, the schema's own draft, formats checked). A
mismatch is logged and counted (``llamaserve_schema_mismatches_total{kind, strict}``): for a
``strict`` schema it is a bug (``engine.constraints.json_schema`` enforces those exactly or refuses
them); for another, one of the relaxations ``engine.constraints.json_schema`` records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jsonschema

from api.chat.tools import OutputRules
from engine.constraints.schema_values import validator_class
from parsers import json_text
from parsers.call_items import MarkupValues
from parsers.message_stream import MessageDelta, MessageStream
from parsers.response_schema import StreamLayout

log = logging.getLogger("llamaserve.schema")
NORMAL_ENDS = ("stop", "tool_calls")  # the model ended it: not cut off


def schema_errors(value: Any, schema: Any) -> str | None:
    """Why ``value`` breaks ``schema`` (None: it is valid, or the schema is not one the
    validator can read); ``multipleOf`` in decimals (``engine.constraints.schema_values``)."""
    if not isinstance(schema, (dict, bool)):
        return None
    try:
        cls = validator_class(schema)
        error = jsonschema.exceptions.best_match(
            cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception:
        return None
    if error is None:
        return None
    return f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message[:200]}"


class CheckedStream(MessageStream):
    """A ``MessageStream`` that checks the finished answer against the request's schemas
    (``finish(reason)``) and reports each mismatch through ``note(kind, strict)``."""

    def __init__(self, layout: StreamLayout, rules: OutputRules,
                 note: Callable[[str, bool], None], *, in_reasoning: bool = False,
                 tools: list[dict[str, Any]] | None = None,
                 markup_values: MarkupValues | None = None) -> None:
        super().__init__(layout, in_reasoning=in_reasoning, tools=tools,
                         markup_values=markup_values)
        self.rules, self.note = rules, note

    def finish(self, reason: str | None = None) -> MessageDelta:
        out = super().finish()
        if reason in NORMAL_ENDS:
            self.check(self.message)
        return out

    def check(self, message: MessageDelta) -> None:
        rules = self.rules
        if rules.json_schema is not None and not message.tool_calls:
            try:
                value = json_text.loads(message.content)
            except ValueError:
                self._report("format", rules.strict, "the answer is not JSON")
            else:
                why = schema_errors(value, rules.json_schema)
                if why is not None:
                    self._report("format", rules.strict, why)
        for call in message.tool_calls:
            fn = self.tools.get(call.name)
            if fn is None:
                continue
            try:
                args = json_text.loads(call.arguments)
            except ValueError:
                self._report("tool", bool(fn.get("strict")), "arguments that are not JSON")
                continue
            why = schema_errors(args, fn.get("parameters") or {"type": "object"})
            if why is not None:
                self._report("tool", bool(fn.get("strict")), f"{call.name}: {why}")

    def _report(self, kind: str, strict: bool, why: str) -> None:
        (log.error if strict else log.info)(
            "a%s %s answer broke its schema: %s", " strict" if strict else "", kind, why)
        self.note(kind, strict)

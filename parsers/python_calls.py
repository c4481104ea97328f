"""Tool calls written as Python calls, as LFM2 writes them: ``[get_weather(city="Paris",
days=3), get_time()]``. Read with Python's own parser (``ast``: nothing is evaluated), each
argument a literal; JSON's ``true`` / ``false`` / ``null`` are taken too, since the forced
call grammar writes JSON values.
"""

from __future__ import annotations

import ast
from typing import Any

MAX_TEXT = 100_000  # characters of a call list parsed (deeper or longer: not calls)
_JSON_NAMES = {"true": True, "false": False, "null": None}


class _NotLiteral(ValueError):
    pass


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _NotLiteral("** in a dict")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise _NotLiteral(str(exc)) from None


def parse_calls(text: str) -> list[dict[str, Any]] | None:
    """``[name(key=value, ...), ...]`` → ``[{"name", "arguments"}, ...]`` (None: not that)."""
    text = text.strip()
    if not text or len(text) > MAX_TEXT:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    calls = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for call in calls:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name | ast.Attribute) \
                or call.args:
            return None
        name = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
        try:
            args = {k.arg: _value(k.value) for k in call.keywords if k.arg is not None}
        except (_NotLiteral, RecursionError):
            return None
        if len(args) != len(call.keywords):
            return None
        out.append({"name": name, "arguments": args})
    return out

"""A family for a template no built-in matches, derived from the template itself (as
llama.cpp's chat layer does): render a conversation whose assistant turn holds known probe
calls, and one whose turn is plain text, and read what surrounds the probe's name and
arguments in the difference. The same for reasoning (``reasoning_content``).

Three call layouts are recognised, the same the built-in families use:

- a JSON object holding the name and the arguments (``{"name": ..., "arguments": ...}``,
  alone or in a JSON list) after a marker;
- markup around the name, then the arguments as one JSON object;
- markup around the name, then each argument as key / value markup.

``derive(template)`` gives a ``Family`` (its schema in the Hugging Face ``x-regex`` format
and its ``CallShape``) or None with the reason, which the start-up log says once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from parsers.call_shape import CallShape
from parsers.chat_template import ChatTemplate, TemplateError
from parsers.families import Family, _item, _json_args, _kv_args, _schema

NAME, NAME_2 = "probe_fn_7c1", "probe_fn_9d2"
KEY, VALUE, KEY_2, VALUE_2 = "probe_key_a", "probe_value_a", "probe_key_b", "probe_value_b"
CALL_ID = "probe_id_3e5"
NUMBER = 7358
CONTENT, THOUGHT = "probe_content_x", "probe_thought_y"
TOOLS = [{"type": "function", "function": {
    "name": n, "description": "A probe.", "parameters": {"type": "object", "properties": {
        KEY: {"type": "string"}, KEY_2: {"type": "string"}}, "required": [KEY]}}}
    for n in (NAME, NAME_2)]


@dataclass(frozen=True)
class Derived:
    family: Family | None
    why: str  # what was found, or why nothing could be


def _call(name: str, args: dict[str, Any], as_text: bool) -> dict[str, Any]:
    return {"id": CALL_ID, "type": "function", "function": {
        "name": name, "arguments": json.dumps(args) if as_text else args}}


def _render(template: ChatTemplate, assistant: dict[str, Any]) -> str:
    return template.render([{"role": "user", "content": "probe_user"}, assistant],
                           tools=TOOLS, add_generation_prompt=False)


def _difference(a: str, b: str) -> str:
    """``b`` without the prefix and suffix it shares with ``a``, widened to whole markers
    (``<|tool_calls|>`` against ``<|content|>`` differs after ``<|``, but the marker is
    the whole tag)."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    for opener, closer in (("<", ">"), ("[", "]")):
        k = b.rfind(opener, 0, i)
        if k >= 0 and closer not in b[k:i]:
            i = k
    suffix = b[len(b) - j:]
    for opener, closer in (("<", ">"), ("[", "]")):
        m = suffix.find(closer)
        if m >= 0 and opener not in suffix[:m]:
            j = min(j, len(suffix) - m - 1)
    return b[i:len(b) - j]


def _from_marker(text: str) -> str:
    """``text`` from its first marker on (a common suffix can start inside the marker
    before it: ``｜><｜tool▁call▁begin｜>``)."""
    k = min((i for i in (text.find("<"), text.find("[")) if i >= 0), default=-1)
    return text[k:] if k > 0 else text


def _first_marker(text: str) -> str:
    """``text`` up to the end of its first whole marker (a section's end, without the
    end-of-turn markup the template writes after it)."""
    for i, c in enumerate(text):
        if c in ">]" and text[i + 1:i + 2] in ("<", "["):
            return text[:i + 1]
    return text


@dataclass(frozen=True)
class Regions:
    """The assistant turn's text (as it differs from a plain answer) for: one call, one
    call with two arguments, two calls, one call whose argument is a number; and the whole
    rendering of a turn with reasoning."""

    one: str
    two_args: str
    two: str
    number: str
    thought: str
    prompt: str  # a thinking turn's generation prompt

def _regions(template: ChatTemplate) -> Regions | None:
    """None if the template cannot render calls in either form of arguments."""
    plain = _render(template, {"role": "assistant", "content": CONTENT})
    for as_text in (False, True):
        try:
            one = _render(template, {"role": "assistant", "content": "", "tool_calls": [
                _call(NAME, {KEY: VALUE}, as_text)]})
            two_args = _render(template, {"role": "assistant", "content": "", "tool_calls": [
                _call(NAME, {KEY: VALUE, KEY_2: VALUE_2}, as_text)]})
            two = _render(template, {"role": "assistant", "content": "", "tool_calls": [
                _call(NAME, {KEY: VALUE}, as_text), _call(NAME_2, {KEY: VALUE}, as_text)]})
            number = _render(template, {"role": "assistant", "content": "", "tool_calls": [
                _call(NAME, {KEY: NUMBER}, as_text)]})
        except TemplateError:
            continue
        try:
            thought = _render(template, {"role": "assistant", "content": CONTENT,
                                         "reasoning_content": THOUGHT})
        except TemplateError:
            thought = ""
        try:
            prompt = template.render([{"role": "user", "content": "probe_user"}],
                                     tools=TOOLS, enable_thinking=True)
        except TemplateError:
            prompt = ""
        return Regions(_difference(plain, one), _difference(plain, two_args),
                       _difference(plain, two), _difference(plain, number), thought,
                       prompt)
    return None


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n:]


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _json_at(text: str, value: Any) -> tuple[int, int] | None:
    """Where a JSON value equal to ``value`` is written in ``text``."""
    decoder = json.JSONDecoder()
    for i, c in enumerate(text):
        if c in "{[":
            try:
                got, end = decoder.raw_decode(text, i)
            except ValueError:
                continue
            if got == value:
                return i, end
    return None


def _literal(text: str) -> str:
    """A marker as a regex, the id of a probe call as any id."""
    return ".*?".join(re.escape(part) for part in text.strip().split(CALL_ID))


def _section(open_: str, close: str, group: str = "(.*?)") -> str:
    end = f"(?:{_literal(close)}|$)" if close.strip() else "$"
    return f"{_literal(open_)}{group if close.strip() else '(.*)'}{end}"


def _split(one: str, two: str, one_at: tuple[int, int], two_at: tuple[int, int],
           first_end: int) -> tuple[str, str, str, str, str]:
    """section_open, call_open, call_close, separator, section_close from one call's text
    (the call's own part at ``one_at``) and two calls' (the second call's own part at
    ``two_at``, the first's ending at ``first_end``)."""
    before, after = one[:one_at[0]], one[one_at[1]:]
    between = two[first_end:two_at[0]]  # call_close + separator + call_open
    call_open = _from_marker(_common_suffix(before, between))
    call_close = _common_prefix(after, between[:len(between) - len(call_open)])
    separator = between[len(call_close):len(between) - len(call_open)]
    sec_open = before[:len(before) - len(call_open)]
    sec_close = _first_marker(after[len(call_close):]) if sec_open.strip() else ""
    return sec_open, call_open, call_close, separator, sec_close


_TAG_BEFORE = re.compile(r"(<[^<>\s]+>|\[[^\[\]\s]+\])\s*$")
_TAG_AFTER = re.compile(r"^\s*(<[^<>\s]+>|\[[^\[\]\s]+\])")


_NOT_A_NAME = re.compile(r"[/_|:\[\]<>]|start|end|begin", re.IGNORECASE)


def _paired(start: str, end: str) -> bool:
    """``<think>`` / ``</think>``, ``[THINK]`` / ``[/THINK]``, ``<|START_THINKING|>`` /
    ``<|END_THINKING|>``: one name, opened and closed."""
    name = _NOT_A_NAME.sub("", start)
    return start != end and bool(name) and name == _NOT_A_NAME.sub("", end)


def _reasoning(thought: str, prompt: str, source: str) -> tuple[str, str] | None:
    """The markers right around the probe's reasoning, when the template writes it; else
    the tag a thinking prompt ends with, when the template's source holds its closing
    tag."""
    i = thought.find(THOUGHT)
    j = thought.find(CONTENT, i)
    if i >= 0 and j >= 0:
        start = _TAG_BEFORE.search(thought[:i])
        end = _TAG_AFTER.search(thought[i + len(THOUGHT):j])
        if start is not None and end is not None and _paired(start.group(1), end.group(1)):
            return start.group(1), end.group(1)
    opened = _TAG_BEFORE.search(prompt)
    if opened is not None and opened.group(1).startswith("<"):
        tag = opened.group(1)
        closing = f"</{tag[1:]}"
        if closing in source:
            return tag, closing
    return None


def derive(template: ChatTemplate) -> Derived:
    try:
        regions = _regions(template)
    except TemplateError as exc:
        return Derived(None, f"the template cannot render a probe conversation ({exc})")
    if regions is None:
        return Derived(None, "the template cannot render an assistant's tool call")
    one, two_args, two = regions.one, regions.two_args, regions.two
    think = _reasoning(regions.thought, regions.prompt, template.source)
    if one.count(NAME) != 1 or NAME_2 not in two:
        return Derived(None, "the template does not write an assistant's tool calls "
                       "where the probe can find them")
    args = _json_at(one, {KEY: VALUE})
    shaped = _json_object(one, think) if args is not None else None
    if shaped is None and args is not None:
        shaped = _name_then_json(one, two, args, think)
    if shaped is None and args is None and VALUE in one:
        shaped = _name_then_pairs(one, two_args, two, regions.number, think)
    if shaped is None:
        return Derived(None, "the probe's calls are written in a layout it cannot read")
    problem = _reads_back(shaped, regions)
    if problem:
        return Derived(None, f"the markup derived from it does not read back ({problem})")
    return Derived(shaped, "derived from the template's own rendering of probe calls")


def _reads_back(family: Family, regions: Regions) -> str | None:
    """What goes wrong reading the template's own renderings of the probe calls (and the
    derived shape's) with the derived schema (None: they read back exactly)."""
    from parsers.message_stream import MessageStream
    from parsers.response_schema import SchemaError, stream_layout

    try:
        layout = stream_layout(family.schema)
    except SchemaError as exc:
        return str(exc)
    one, two = [(NAME, {KEY: VALUE})], [(NAME, {KEY: VALUE}), (NAME_2, {KEY: VALUE})]
    assert family.shape is not None
    for text, calls in ((regions.one, one), (regions.two, two),
                        (family.shape.render(two), two)):
        stream = MessageStream(layout, tools=TOOLS)
        stream.feed(text)
        stream.finish("stop")
        got = [(c.name, json.loads(c.arguments)) for c in stream.message.tool_calls]
        if got != calls:
            return f"{text!r} read as {got}"
    return None


def _either(a: str, b: str) -> str:
    """A regex for a marker the template writes in two forms (a string value's and a
    number's: ``" string="true">`` / ``" string="false">``)."""
    if a == b:
        return _literal(a)
    head = _common_prefix(a, b)
    tail = _common_suffix(a[len(head):], b[len(head):])
    return f"{_literal(head)}[^<>\n]*?{_literal(tail)}"


def _calls_schema(shape: CallShape, item: dict[str, Any], think: tuple[str, str] | None
                  ) -> dict[str, Any]:
    """The response schema of calls in ``shape``, each read by ``item``: an iterator over
    the calls, within their section when there is one."""
    open_, close = shape.call_open, shape.call_close
    call = f"{_literal(open_)}(.*?)" + (f"(?:{_literal(close)}|$)" if close.strip() else
                                        f"(?={_literal(open_)}|$)")
    calls: dict[str, Any] = {"type": "array", "x-regex-iterator": call, "items": item}
    if shape.section_open.strip():
        calls["x-regex"] = _section(shape.section_open, shape.section_close)
    elif not close.strip():  # calls end where the next begins: one section to the end
        calls["x-regex"] = f"({_literal(open_)}.*)$"
    return _schema(calls, _literal(shape.section_open.strip() or open_), think)


def _family(schema: dict[str, Any], shape: CallShape) -> Family:
    return Family("derived", "derived from its chat template", (), schema, shape)


def _json_object(one: str, think: tuple[str, str] | None) -> Family | None:
    """``{"name": NAME, "arguments": {...}}`` objects (alone, or in a JSON list)."""
    decoder = json.JSONDecoder()
    for i, c in enumerate(one):
        if c != "{":
            continue
        try:
            obj, end = decoder.raw_decode(one, i)
        except ValueError:
            continue
        if not isinstance(obj, dict) or NAME not in obj.values():
            continue
        name_key = next(k for k, v in obj.items() if v == NAME)
        args_key = next((k for k, v in obj.items() if isinstance(v, (dict, str)) and
                         v in ({KEY: VALUE}, json.dumps({KEY: VALUE}))), None)
        if name_key not in ("name", "tool_name") or args_key not in ("arguments",
                                                                    "parameters"):
            return None
        before, after = one[:i], one[end:]
        listed = before.rstrip().endswith("[") and after.lstrip().startswith("]")
        if listed:
            open_, close = before.rstrip()[:-1], after.lstrip()[1:]
            calls = {"type": "array", "x-regex": _section(open_, close, r"(\[.*?\])")
                     if close.strip() else f"{_literal(open_)}(\\[.*)$",
                     "x-parser": "json", "items": {"type": "object"}}
            shape = CallShape(f'{{"{name_key}": "', f'", "{args_key}": ', "}",
                              f"{open_.strip()}[", f"]{close.strip()}", ", ")
        else:
            if not before.strip():
                return None  # a bare object: the Llama 3 family's reading, not derived here
            calls = {"type": "array", "x-regex": _section(before, after),
                     "x-regex-iterator": r"(\{.*\})",
                     "items": {"type": "object", "x-parser": "json"}}
            shape = CallShape(f'{{"{name_key}": "', f'", "{args_key}": ', "}",
                              before.strip(), after.strip())
        return _family(_schema(calls, _literal(before if not listed else open_), think),
                       shape)
    return None


def _name_then_json(one: str, two: str, args: tuple[int, int],
                    think: tuple[str, str] | None) -> Family | None:
    """Markup, the name, markup, the arguments as JSON, markup."""
    at = one.find(NAME)
    if at > args[0]:
        return None
    name_close = one[at + len(NAME):args[0]]
    second = two.find(NAME_2)
    first_args = _json_at(two, {KEY: VALUE})
    if second < 0 or first_args is None or not name_close.strip():
        return None
    sec_open, call_open, call_close, separator, sec_close = _split(
        one, two, (at, args[1]), (second, len(two)), first_args[1])
    if not call_open.strip():
        return None
    item = _item(rf"^\s*(.*?)\s*{_literal(name_close)}",
                 _json_args(rf"{_literal(name_close)}\s*(.*?)\s*$"))
    shape = CallShape(call_open, name_close, call_close, sec_open, sec_close, separator)
    # the regexes take any id where the template wrote the probe's; a forced call writes 0
    return _family(_calls_schema(shape, item, think),
                   replace(shape, call_open=call_open.replace(CALL_ID, "0")))


def _name_then_pairs(one: str, two_args: str, two: str, number: str,
                     think: tuple[str, str] | None) -> Family | None:
    """Markup, the name, then each argument as key / value markup."""
    at, k, v = one.find(NAME), one.find(KEY), one.find(VALUE)
    k2, v1 = two_args.find(KEY_2), two_args.find(VALUE)
    if not 0 <= at < k < v or k2 < 0 or v1 < 0:
        return None
    head = one[at + len(NAME):k]  # name_close + key_open
    between = two_args[v1 + len(VALUE):k2]  # value_close + key_open
    key_open = _from_marker(_common_suffix(head, between))
    value_close = between[:len(between) - len(key_open)]
    tail = one[v + len(VALUE):]  # value_close + call_close + ...
    if not key_open.strip() or not tail.startswith(value_close):
        return None
    name_close, key_close = head[:len(head) - len(key_open)], one[k + len(KEY):v]
    n_k = number.find(KEY)
    n_v = number.find(str(NUMBER), n_k)
    key_close_json = number[n_k + len(KEY):n_v] if 0 <= n_k < n_v else key_close
    second = two.find(NAME_2)
    if second < 0:
        return None
    first_end = two.find(value_close, two.find(VALUE)) + len(value_close)
    sec_open, call_open, call_close, separator, sec_close = _split(
        one, two, (at, v + len(VALUE) + len(value_close)), (second, len(two)), first_end)
    if not call_open.strip():
        return None
    stop_name = _literal(name_close) if name_close.strip() else _literal(key_open)
    item = _item(rf"^\s*(.*?)\s*(?:{stop_name}|$)", _kv_args(
        rf"^.*?{stop_name}(.*)$" if name_close.strip() else r"^[^\n<]*(.*)$",
        f"{_literal(key_open)}(?P<key>.*?){_either(key_close, key_close_json)}"
        f"(?P<value>.*?){_literal(value_close)}"))
    shape = CallShape(call_open, name_close, call_close, sec_open, sec_close, separator,
                      key_open, key_close, value_close, key_close_json)
    return _family(_calls_schema(shape, item, think), shape)

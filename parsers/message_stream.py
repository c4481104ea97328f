"""Model text -> reasoning, content and tool calls, incrementally.

A ``MessageStream`` is fed the generated text chunk by chunk and returns only
what is new. Text is held back only while it could still be the start of a
marker (or whitespace that may precede a tool call), and every search resumes
where the previous one stopped, so the work per stream is linear in its length.
Feeding the whole text at once gives the same message as any chunking, which is
how the non-streamed response is built.

Layout: ``[reasoning] content [tool call]*``. Reasoning runs until its end
marker (an unterminated reasoning block, e.g. cut off by ``max_tokens``, stays
reasoning). A tool-call block is parsed when its end marker arrives, with the
schema's ``x-regex-iterator`` and item schema. With tools offered, an answer that
is only a bare JSON ``{"name": ..., "arguments": ...}`` (optionally fenced) is a
tool call too: small models often answer that way.

Tool calls stream: a call is announced (a ``CallChunk`` with its name) as soon as
its name is known, JSON arguments (``{"name": ..., "arguments": {...}}`` blocks)
follow as the model writes them and are returned exactly as written, and the last
chunk closes the call. XML parameter blocks (and Gemma 4's ``call:NAME{...}``, read by
``parsers.gemma4``) are announced early and their arguments,
typed by the tool's schema, come whole at the end. A bare JSON answer is a call only
if the whole answer is that value. Nothing is held back longer than it takes to
decide: a marker's length, a short run of whitespace, or one JSON value whose head
names an offered tool (any other head, or text after the value, is content at once).

gpt-oss's harmony channels (``StreamLayout.family == "harmony"``) are read by
``parsers.harmony`` behind the same interface.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parsers import json_text
from parsers.call_items import MarkupValues, ToolCall, new_call_id, read_bare_calls, read_call
from parsers.response_schema import StreamLayout, apply_schema

__all__ = ["CallChunk", "MessageDelta", "MessageStream", "ToolCall", "new_call_id"]

if TYPE_CHECKING:
    from parsers.harmony import HarmonyParser

_JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*'
                        r'"(?:arguments|parameters)"\s*:\s*(?=\{)')
_XML_HEAD = re.compile(r"\s*<function=([^>\n]{1,256})>")
_GEMMA4_HEAD = re.compile(r"\s*call:(\w{1,256})[{\[]")  # Gemma 4: call:NAME{key:value,...}
_BARE_OPEN = re.compile(r"\s*(?:```(?:json)?\s*)?\[?\s*")
_VALUE_START = re.compile(r"\s*(?:```(?:json)?\s*)?")
_FENCE_OPENING = re.compile(r"\s*```[A-Za-z]*")
_BARE_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)')
HEAD_LIMIT = 512  # chars of a call block (or a bare JSON answer) searched for a tool name
MAX_HELD_SPACE = 64  # trailing whitespace held back in case a call marker follows


@dataclass(frozen=True)
class CallChunk:
    """A piece of a streamed tool call. The first chunk of a call has its ``name``, the
    last has ``done``; a call's ``arguments`` pieces join to its ``ToolCall.arguments``."""

    index: int  # the call's position among the message's calls
    id: str
    name: str = ""
    arguments: str = ""
    done: bool = False


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)  # calls completed now
    calls: list[CallChunk] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls or self.calls)

    def extend(self, other: MessageDelta) -> MessageDelta:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.calls.extend(other.calls)
        return self


@dataclass
class _Arguments:
    """Scans a JSON object's text as it arrives, to find where it ends."""

    start: int
    pos: int = 0
    sent: int = 0
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    end: int | None = None

    def scan(self, text: str) -> str:
        """Advance over ``text`` (the whole block so far); the newly scanned piece."""
        i = max(self.pos, self.start)
        while i < len(text) and self.end is None:
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = i + 1
            i += 1
        self.pos = i
        piece = text[max(self.sent, self.start):i]
        self.sent = i
        return piece


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class MessageStream:
    REASONING, CONTENT, CALL, AFTER_CALLS, BARE_JSON = range(5)

    def __init__(self, layout: StreamLayout, *, in_reasoning: bool = False,
                 tools: list[dict[str, Any]] | None = None, bare_json_calls: bool = True,
                 markup_values: MarkupValues | None = None) -> None:
        self.layout = layout
        self.tools = {t["function"]["name"]: t["function"] for t in tools or []
                      if isinstance(t.get("function"), dict) and "name" in t["function"]}
        # how call markup's grammar wrote each declared parameter, by tool
        self.markup_values = markup_values or {}
        self.bare_json = bare_json_calls and bool(self.tools)
        self.state = self.REASONING if in_reasoning and layout.reasoning_end else self.CONTENT
        self.buf = layout.prompt_tail or ""  # (read as if the model wrote it)
        self.block = ""  # the tool-call block being collected (after its start marker)
        self.scanned = 0  # how much of ``block`` has been searched for the end marker
        self.started = False  # any content or reasoning emitted (or opener consumed)
        self.skip_ws = False  # drop whitespace at the start of content (after reasoning)
        self.message = MessageDelta()  # everything so far
        self.harmony: HarmonyParser | None = None
        if layout.family == "harmony":  # gpt-oss's channels: a parser of their own
            from parsers.harmony import HarmonyParser
            self.harmony = HarmonyParser(in_reasoning)
        self.n_calls = 0
        self.call: CallChunk | None = None  # the announced call being written
        self.args: _Arguments | None = None  # its JSON arguments, streamed as written
        self.bare: _Arguments | None = None  # a bare JSON answer that names a tool

    # -- public -----------------------------------------------------------------------
    def feed(self, text: str) -> MessageDelta:
        if self.harmony is not None:
            return self._record(self.harmony.feed(text))
        self.buf += text
        out = MessageDelta()
        while self.buf and self._step(out):
            pass
        return self._record(out)

    def finish(self, reason: str | None = None) -> MessageDelta:
        """The rest of the answer; ``reason``: the engine's finish reason (a section of calls
        cut off by "length" is incomplete; subclasses that check the whole answer,
        ``api/chat/answer_check.py``, read it too)."""
        if self.harmony is not None:
            return self._record(self.harmony.finish())
        out = MessageDelta()
        if self.state == self.REASONING:
            out.reasoning += self.buf
        elif self.state == self.CONTENT:
            if not self.started and self.buf == self.layout.prompt_tail:
                self.buf = ""  # nothing written after the prompt's own markup
            out.content += self.buf if self.started or not self.skip_ws else self.buf.lstrip()
        elif self.state == self.CALL and self.layout.block_start:
            self._section(out, self.block + self.buf, complete=reason != "length")
        elif self.state == self.CALL:
            self.block += self.buf
            self._scan_arguments(out)
            if self.call is not None and self.args is not None:
                end = self.args.end if self.args.end is not None else len(self.block)
                self._close(out, self.block[self.args.start:end], self.args.end is not None)
            else:
                parsed = self._parse_call(self.block, complete=False)
                if parsed is not None or self.call is not None:
                    self._whole(out, parsed, complete=parsed is not None)
                else:  # cut off before it names a tool: the text as it is, never nothing
                    out.content += f"{self.layout.call_start}{self.block}"
        elif self.state == self.BARE_JSON:
            calls = self._bare_calls(self.buf)
            if calls is None:
                out.content += self.buf
            else:
                for call in calls:
                    self._whole(out, call, complete=True)
        self.buf = ""
        return self._record(out)

    # -- states ---------------------------------------------------------------------------
    def _step(self, out: MessageDelta) -> bool:
        """Consume what can be decided from ``buf``; False when it must wait for more."""
        lay = self.layout
        if self.state == self.REASONING:
            assert lay.reasoning_end is not None
            if not self.started and lay.content_start:  # no reasoning: content's own opener
                head = self.buf.lstrip()
                if head.startswith(lay.content_start):
                    self.state = self.CONTENT
                    return True
                if lay.content_start.startswith(head):
                    return False
            i = self.buf.find(lay.reasoning_end)
            if i >= 0:
                out.reasoning += self._strip_opener(self.buf[:i].rstrip())
                self.buf = self.buf[i + len(lay.reasoning_end):]
                self.state, self.skip_ws, self.started = self.CONTENT, True, False
                return True
            keep = _held_prefix(self.buf, lay.reasoning_end)
            if not self.started and lay.reasoning_start and lay.reasoning_start.startswith(
                    self.buf.lstrip()):
                return False  # maybe the opener, still arriving
            body = self.buf[: len(self.buf) - keep]
            trailing = len(body) - len(body.rstrip())  # dropped if the end marker follows
            if trailing > MAX_HELD_SPACE:
                trailing = 0
            out.reasoning += self._strip_opener(body[: len(body) - trailing])
            self.buf = self.buf[len(body) - trailing:]
            return False
        if self.state == self.CONTENT:
            return self._content(out)
        if self.state == self.CALL:
            return self._call(out)
        if self.state == self.AFTER_CALLS:
            rest, start = self.buf.lstrip(), lay.block_start or lay.call_start
            if start and rest.startswith(start):
                self.buf = rest[len(start):]
                self.state, self.block, self.scanned = self.CALL, "", 0
                return True
            if start and start.startswith(rest):
                self.buf = rest
                return False
            self.buf = ""  # text after the tool calls is not part of the message
            return False
        return self._bare_json(out)

    def _strip_opener(self, text: str) -> str:
        opener = self.layout.reasoning_start
        if not self.started:
            stripped = text.lstrip()
            if opener and stripped.startswith(opener):
                text = stripped[len(opener):]
            if text:
                text = text.lstrip("\n")
                self.started = bool(text)
        return text

    def _content(self, out: MessageDelta) -> bool:
        lay = self.layout
        if self.skip_ws:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return False
            self.skip_ws = False
        if not self.started:
            head = self.buf.lstrip()
            if lay.reasoning_start and lay.reasoning_end:
                if head.startswith(lay.reasoning_start):
                    self.state = self.REASONING
                    return True
                if lay.reasoning_start.startswith(head):
                    return False  # could still be the opener
                if head.startswith(lay.reasoning_end):  # an empty reasoning, no opener
                    self.buf = head[len(lay.reasoning_end):]  # (MiniMax M3: "</mm:think>")
                    self.skip_ws = True
                    return True
                if lay.reasoning_end.startswith(head):
                    return False  # could still be the closer
            if self.bare_json and (head.startswith("{") or head.startswith("```")
                                   or head.startswith("[")):
                self.state = self.BARE_JSON
                return True
            if self.bare_json and "```".startswith(head):
                return False  # empty so far, or maybe a code fence
            opener = lay.content_start
            if opener and head.startswith(opener):
                self.buf, self.started = head[len(opener):], True
                return True
            if opener and opener.startswith(head):
                return False
        start = lay.block_start or lay.call_start
        if lay.content_end:
            i = self.buf.find(lay.content_end)
            if i >= 0 and not (start and self.buf.find(start, 0, i) >= 0):
                out.content += self.buf[:i]  # only calls may follow content's own closer
                self.buf = self.buf[i + len(lay.content_end):]
                self.state, self.started = self.AFTER_CALLS, True
                return True
        if start:
            i = self.buf.find(start)
            if i >= 0:
                out.content += self.buf[:i].rstrip()
                self.buf = self.buf[i + len(start):]
                self.state, self.block, self.scanned = self.CALL, "", 0
                self.started = True
                return True
        keep = max(_held_prefix(self.buf, start) if start else 0,
                   _held_prefix(self.buf, lay.content_end) if lay.content_end else 0)
        body = self.buf[: len(self.buf) - keep]
        trailing = len(body) - len(body.rstrip()) if start else 0  # may precede a call
        if trailing > MAX_HELD_SPACE:
            trailing = 0
        emit = body[: len(body) - trailing]
        if emit:
            out.content += emit
            self.started = True
        self.buf = self.buf[len(emit):]
        return False

    def _call(self, out: MessageDelta) -> bool:
        if self.layout.block_start:
            return self._block(out)
        end = self.layout.call_end
        assert end is not None
        self.block += self.buf
        self.buf = ""
        if self.call is None and len(self.block) <= HEAD_LIMIT:
            self._announce(out)
        self._scan_arguments(out)
        if self.args is not None and self.args.end is None:
            return False  # the end marker is searched for after the arguments
        frm = max(self.args.end if self.args is not None and self.args.end else 0,
                  self.scanned - len(end) + 1)
        i = self.block.find(end, frm)
        if i < 0:
            self.scanned = len(self.block)
            return False
        if self.call is not None and self.args is not None:
            self._close(out, self.block[self.args.start:self.args.end], True)
        else:
            parsed = self._parse_call(self.block[:i], complete=True)
            if parsed is not None or self.call is not None:
                self._whole(out, parsed, complete=parsed is not None)
        self.buf = self.block[i + len(end):]
        self.block, self.scanned, self.state = "", 0, self.AFTER_CALLS
        return True

    def _block(self, out: MessageDelta) -> bool:
        """A section of calls: collected until its end marker (or the end of the answer),
        then read whole with the tool_calls schema."""
        end = self.layout.block_end
        self.block += self.buf
        self.buf = ""
        i = self.block.find(end, max(0, self.scanned - len(end) + 1)) if end else -1
        if i < 0:
            self.scanned = len(self.block)
            return False
        self.buf = self.block[i + len(end or ""):]
        self._section(out, self.block[:i], complete=True)
        self.block, self.scanned, self.state = "", 0, self.AFTER_CALLS
        return True

    def _section(self, out: MessageDelta, inner: str, complete: bool) -> None:
        lay = self.layout
        text = f"{lay.block_start}{inner}{lay.block_end or ''}"
        items = apply_schema(lay.calls_schema or {}, text)
        calls = [c for c in map(self._tool_call, items if isinstance(items, list) else [])
                 if c is not None]
        if not calls:  # not calls after all: the text as it is, never nothing
            out.content += f"{lay.block_start}{inner}"
            return
        for call in calls:
            self._whole(out, call, complete=complete)

    def _announce(self, out: MessageDelta) -> None:
        """Open the call once its name can be read from the block's head."""
        m = _JSON_HEAD.match(self.block)
        if m is not None:
            name = _json_string(m.group(1))
            if name:
                self._open(out, name)
                self.args = _Arguments(m.end())
            return
        x = _XML_HEAD.match(self.block) or _GEMMA4_HEAD.match(self.block)
        if x is not None and x.group(1).strip():
            self._open(out, x.group(1).strip())

    def _scan_arguments(self, out: MessageDelta) -> None:
        if self.call is not None and self.args is not None:
            piece = self.args.scan(self.block)
            if piece:
                out.calls.append(CallChunk(self.call.index, self.call.id, arguments=piece))

    def _open(self, out: MessageDelta, name: str) -> None:
        self.call = CallChunk(self.n_calls, new_call_id(), name=name)
        self.n_calls += 1
        out.calls.append(self.call)

    def _close(self, out: MessageDelta, arguments: str, complete: bool) -> None:
        """Close the announced call whose arguments were streamed as written."""
        assert self.call is not None
        out.calls.append(CallChunk(self.call.index, self.call.id, done=True))
        out.tool_calls.append(ToolCall(self.call.id, self.call.name, arguments, complete))
        self.call, self.args = None, None

    def _whole(self, out: MessageDelta, parsed: ToolCall | None, complete: bool) -> None:
        """A call whose arguments come at once: closes the announced call (keeping the name
        it was announced with) or opens and closes a new one."""
        if self.call is None:
            assert parsed is not None
            self._open(out, parsed.name)
        assert self.call is not None
        arguments = parsed.arguments if parsed is not None else "{}"
        out.calls.append(CallChunk(self.call.index, self.call.id, arguments=arguments,
                                   done=True))
        out.tool_calls.append(ToolCall(self.call.id, self.call.name, arguments, complete))
        self.call, self.args = None, None

    def _bare_json(self, out: MessageDelta) -> bool:
        """An answer starting like JSON, with tools offered: a call only if the whole answer
        is one JSON value naming an offered tool. Held while its head may still name a tool
        and until that value closes; released as content as soon as it cannot be a call
        (another head, or text after the value)."""
        start = _BARE_OPEN.match(self.buf).end()  # type: ignore[union-attr]
        head = self.buf[start:]
        if not head or _FENCE_OPENING.fullmatch(self.buf):
            return False
        if self.bare is None:
            m = _BARE_NAME.match(head) if len(head) <= HEAD_LIMIT else None
            if m is None and len(head) <= HEAD_LIMIT:
                maybe = re.sub(r"\s+", "", head[:16])
                if '{"name":"'.startswith(maybe) and len(maybe) < 9:
                    return False  # the head is still arriving
            elif m is not None:
                name = _json_string(m.group(1)) if m.group(2) else None
                if name is not None and name in self.tools:
                    value = _VALUE_START.match(self.buf)
                    self.bare = _Arguments(value.end() if value else start)
                elif name is None and any(t.startswith(m.group(1)) for t in self.tools):
                    return False  # the name is still arriving
            if self.bare is None:
                return self._not_a_call()
        self.bare.scan(self.buf)
        if self.bare.end is not None:
            rest = self.buf[self.bare.end:].strip()
            if rest.startswith("```"):
                rest = rest[3:].strip()
            elif "```".startswith(rest):
                rest = ""  # maybe the closing fence, still arriving
            if rest:
                return self._not_a_call()  # text after the value: an answer, not a call
        return False

    def _not_a_call(self) -> bool:
        self.state, self.started, self.bare = self.CONTENT, True, None
        return True  # content as usual, from the start of the buffer

    # -- tool calls -----------------------------------------------------------------------
    def _parse_call(self, inner: str, complete: bool) -> ToolCall | None:
        lay = self.layout
        assert lay.call_start is not None and lay.call_end is not None
        group = inner.strip()
        if complete and lay.call_regex:
            m = re.search(lay.call_regex, f"{lay.call_start}{inner}{lay.call_end}", re.DOTALL)
            if m is not None:
                group = m.group(1) if m.re.groups else m.group(0)
        item = apply_schema(lay.call_schema or {}, group)
        return self._tool_call(item)

    def _tool_call(self, item: Any) -> ToolCall | None:
        return read_call(item, self.tools, self.markup_values)

    def _bare_calls(self, text: str) -> list[ToolCall] | None:
        return read_bare_calls(text, self.tools)

    def _record(self, out: MessageDelta) -> MessageDelta:
        self.message.reasoning += out.reasoning
        self.message.content += out.content
        self.message.tool_calls.extend(out.tool_calls)
        return out


def _json_string(body: str) -> str | None:
    try:
        value = json_text.loads(f'"{body}"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None

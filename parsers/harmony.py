"""gpt-oss's harmony messages -> reasoning, content and tool calls, incrementally.

The answer after ``<|start|>assistant`` is a run of messages, each a header, ``<|message|>``,
a body and an end (here one message a line, the call's broken in two)::

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
    {...}<|call|>
    <|start|>assistant<|channel|>final<|message|>...<|return|>

``analysis`` bodies are reasoning, ``final`` bodies (and ``commentary`` without a
recipient: preambles) are content, a body addressed ``to=functions.NAME`` (in the header,
before or after the channel, as gpt-oss writes both) is a call to NAME whose body is its
JSON arguments, streamed as written. ``<|call|>`` and ``<|return|>`` end generation, so a
message may also end with the text. A prompt that opened the analysis channel
(``in_reasoning``) starts in its body. A head that is no header (none within
``HEAD_LIMIT`` characters, or an end before ``<|message|>``) is content as it is.

Pure text: ``parsers.message_stream.MessageStream`` hands a harmony layout's text here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parsers import json_text
from parsers.message_stream import CallChunk, MessageDelta, ToolCall, new_call_id

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
HEAD_LIMIT = 512
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_ROLE = re.compile(r"^\s*(?:<\|start\|>\s*\w*)?")


def _held(text: str) -> int:
    """Length of the longest suffix of ``text`` that may start an end marker."""
    for n in range(min(max(len(e) for e in ENDS) - 1, len(text)), 0, -1):
        if any(e.startswith(text[-n:]) for e in ENDS):
            return n
    return 0


@dataclass
class _Message:
    channel: str
    call: CallChunk | None = None  # a body addressed to a tool
    arguments: str = ""  # the call's arguments streamed so far
    space: str = ""  # whitespace held back (a call's arguments end without it)


class HarmonyParser:
    def __init__(self, in_reasoning: bool) -> None:
        self.buf = ""
        self.message: _Message | None = _Message("analysis") if in_reasoning else None
        self.n_calls = 0

    def feed(self, text: str) -> MessageDelta:
        self.buf += text
        out = MessageDelta()
        while self.buf and self._step(out):
            pass
        return out

    def finish(self) -> MessageDelta:
        out = MessageDelta()
        if self.message is None:
            head = self.buf
            self.buf = ""
            if head.strip():
                out.content += self._head_text(head)
        else:
            self._body(out, self.buf)
            self.buf = ""
            self._end(out)
        return out

    # -- states ---------------------------------------------------------------------------
    def _step(self, out: MessageDelta) -> bool:
        if self.message is None:
            return self._header(out)
        hits = [(i, e) for e in ENDS if (i := self.buf.find(e)) >= 0]
        if hits:
            i, end = min(hits)
            self._body(out, self.buf[:i])
            self._end(out)
            self.buf = self.buf[i + (0 if end == "<|start|>" else len(end)):]
            return True
        keep = _held(self.buf)
        self._body(out, self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False

    def _header(self, out: MessageDelta) -> bool:
        i = self.buf.find(MESSAGE)
        ends = [j for e in ENDS[:3] if (j := self.buf.find(e)) >= 0]
        if i < 0 or (ends and min(ends) < i):
            if ends or len(self.buf) > HEAD_LIMIT:  # no header: content as it is
                cut = min(ends) if ends else len(self.buf)
                out.content += self._head_text(self.buf[:cut])
                self.buf = self.buf[cut:]
                for e in ENDS[:3]:
                    if self.buf.startswith(e):
                        self.buf = self.buf[len(e):]
                return bool(self.buf)
            return False
        head, self.buf = self.buf[:i], self.buf[i + len(MESSAGE):]
        channel = _CHANNEL.search(head)
        recipient = _RECIPIENT.search(head)
        self.message = _Message(channel.group(1) if channel else "final")
        if recipient is not None and recipient.group(1) != "assistant":
            name = recipient.group(1).removeprefix("functions.")
            self.message.call = CallChunk(self.n_calls, new_call_id(), name=name)
            self.n_calls += 1
            out.calls.append(self.message.call)
        return True

    def _head_text(self, head: str) -> str:
        return head[_ROLE.match(head).end():]  # type: ignore[union-attr]

    def _body(self, out: MessageDelta, text: str) -> None:
        m = self.message
        if m is None or not text:
            return
        if m.call is not None:
            if not m.arguments:
                text = text.lstrip()
            text = m.space + text
            body = text.rstrip()
            m.space = text[len(body):]
            if body:
                m.arguments += body
                out.calls.append(CallChunk(m.call.index, m.call.id, arguments=body))
        elif m.channel == "analysis":
            out.reasoning += text
        else:
            out.content += text

    def _end(self, out: MessageDelta) -> None:
        m, self.message = self.message, None
        if m is None or m.call is None:
            return
        try:
            complete = isinstance(json_text.loads(m.arguments), dict)
        except ValueError:
            complete = False
        out.calls.append(CallChunk(m.call.index, m.call.id, done=True,
                                   arguments="" if m.arguments else "{}"))
        out.tool_calls.append(ToolCall(m.call.id, m.call.name, m.arguments or "{}", complete))

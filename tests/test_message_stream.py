"""Response parsing as data tables: every shipped schema, whole and chunk by chunk."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from conftest import load_config
from parsers.message_stream import MessageDelta, MessageStream
from parsers.response_schema import apply_schema, stream_layout

SCHEMAS = {name: load_config(f"{name}.json")["model"]["response_schema"]
           for name in ("qwen2.5-coder-0.5b", "qwen3.5-0.8b", "gemma3-270m")}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "metric": {"type": "boolean"}}, "required": ["city"]}}}]


@dataclass
class Case:
    id: str
    schema: str
    text: str
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    in_reasoning: bool = False
    tools: list[dict[str, Any]] | None = None


CASES = [
    # Qwen2.5 / Hermes
    Case("hermes plain", "qwen2.5-coder-0.5b", "Paris is the capital.",
         content="Paris is the capital."),
    Case("hermes call", "qwen2.5-coder-0.5b",
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         calls=[("get_weather", {"city": "Paris"})], tools=WEATHER),
    Case("hermes text then two calls", "qwen2.5-coder-0.5b",
         'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", '
         '"days": 2}}\n</tool_call>',
         content="Let me check.", calls=[("get_weather", {"city": "Paris"}),
                                         ("get_weather", {"city": "Rome", "days": 2})],
         tools=WEATHER),
    Case("hermes string arguments", "qwen2.5-coder-0.5b",
         '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
         calls=[("get_weather", {"city": "Oslo"})], tools=WEATHER),
    Case("hermes call cut before its name is kept as text", "qwen2.5-coder-0.5b",
         'Sure.\n<tool_call>\n{"na', content='Sure.<tool_call>\n{"na'),
    Case("hermes lookalike text", "qwen2.5-coder-0.5b", "a < b and <tool> x</tool_call>",
         content="a < b and <tool> x</tool_call>"),
    Case("bare json call", "qwen2.5-coder-0.5b",
         '{"name": "get_weather", "arguments": {"city": "Paris"}}',
         calls=[("get_weather", {"city": "Paris"})], tools=WEATHER),
    Case("fenced bare json call", "qwen2.5-coder-0.5b",
         '```json\n{"name": "get_weather", "arguments": {"city": "Lima", "days": "3"}}\n```',
         calls=[("get_weather", {"city": "Lima", "days": 3})], tools=WEATHER),  # typed
    Case("json answer without tools is content", "qwen2.5-coder-0.5b",
         '{"name": "get_weather", "arguments": {}}',
         content='{"name": "get_weather", "arguments": {}}'),
    Case("json that is not a call stays content", "qwen2.5-coder-0.5b",
         '{"answer": 42}', content='{"answer": 42}', tools=WEATHER),
    Case("bare json naming no tool is content", "qwen2.5-coder-0.5b",
         '{"name": "other", "arguments": {}}', content='{"name": "other", "arguments": {}}',
         tools=WEATHER),
    Case("json list answer is content", "qwen2.5-coder-0.5b", "[1, 2] and [3]",
         content="[1, 2] and [3]", tools=WEATHER),
    Case("bare json call then more text is content", "qwen2.5-coder-0.5b",
         '{"name": "get_weather", "arguments": {"city": "A"}}\n{"response": "x"}',
         content='{"name": "get_weather", "arguments": {"city": "A"}}\n{"response": "x"}',
         tools=WEATHER),
    Case("bare json list of calls", "qwen2.5-coder-0.5b",
         '[{"name": "get_weather", "arguments": {"city": "A"}}, '
         '{"name": "get_weather", "arguments": {"city": "B"}}]',
         calls=[("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})], tools=WEATHER),
    Case("hermes call with braces and quotes in strings", "qwen2.5-coder-0.5b",
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a}\\"{b", "days": 1}}'
         '\n</tool_call>', calls=[("get_weather", {"city": 'a}"{b', "days": 1})], tools=WEATHER),
    Case("trailing whitespace kept when no call follows", "qwen2.5-coder-0.5b",
         "Done.  \n", content="Done.  \n"),
    # Qwen3.5: <think> and XML calls
    Case("qwen3.5 think then content", "qwen3.5-0.8b",
         "<think>\nThe user greets me.\n</think>\n\nHello!",
         reasoning="The user greets me.", content="Hello!"),
    Case("qwen3.5 opener in the prompt", "qwen3.5-0.8b",
         "Short thought.\n</think>\n\nHi there.", reasoning="Short thought.",
         content="Hi there.", in_reasoning=True),
    Case("qwen3.5 cut off mid reasoning", "qwen3.5-0.8b",
         "<think>\nLet me think about this for a wh", reasoning="Let me think about this for a wh"),
    Case("qwen3.5 xml call with typed parameters", "qwen3.5-0.8b",
         "<think>\nNeed weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
         "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
         "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>",
         reasoning="Need weather.",
         calls=[("get_weather", {"city": "Paris", "days": 3, "metric": True})], tools=WEATHER),
    Case("qwen3.5 content then call", "qwen3.5-0.8b",
         "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
         "</parameter>\n</function>\n</tool_call>", content="Checking.",
         calls=[("get_weather", {"city": "New York"})], tools=WEATHER),
    Case("qwen3.5 xml call cut before its name is kept as text", "qwen3.5-0.8b",
         "<tool_call>\n<func", content="<tool_call>\n<func"),
    Case("qwen3.5 no reasoning block", "qwen3.5-0.8b", "Just an answer.",
         content="Just an answer."),
    # Gemma: plain text
    Case("gemma plain", "gemma3-270m", "Hello <b>world</b>\n", content="Hello <b>world</b>\n"),
    Case("gemma empty", "gemma3-270m", ""),
]


def run(case: Case, chunks: list[str]) -> tuple[MessageDelta, list[MessageDelta]]:
    s = MessageStream(stream_layout(SCHEMAS[case.schema]), in_reasoning=case.in_reasoning,
                      tools=case.tools)
    deltas = [s.feed(c) for c in chunks] + [s.finish()]
    return s.message, deltas


def split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) \
        if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def check_chunks(message: MessageDelta, deltas: list[MessageDelta]) -> None:
    """Each call is announced once with its name, closed once, and its argument pieces
    join to its final arguments, in stream order."""
    chunks = [c for d in deltas for c in d.calls]
    assert [c.index for c in chunks if c.name] == list(range(len(message.tool_calls)))
    for i, call in enumerate(message.tool_calls):
        mine = [c for c in chunks if c.index == i]
        assert mine[0].name == call.name and all(not c.name for c in mine[1:])
        assert [c.done for c in mine].count(True) == 1 and mine[-1].done
        assert {c.id for c in mine} == {call.id}
        assert "".join(c.arguments for c in mine) == call.arguments
    assert [c for d in deltas for c in d.tool_calls] == message.tool_calls


def check(case: Case, message: MessageDelta) -> None:
    assert message.reasoning == case.reasoning
    assert message.content == case.content
    got = [(c.name, json.loads(c.arguments)) for c in message.tool_calls]
    assert got == case.calls
    assert all(c.id.startswith("call_") for c in message.tool_calls)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_whole_text(case: Case) -> None:
    check(case, run(case, [case.text])[0])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_any_chunking_gives_the_same_message(case: Case) -> None:
    rng = random.Random(case.id)
    for chunks in [list(case.text), *(split(case.text, rng) for _ in range(20))]:
        message, deltas = run(case, chunks)
        check(case, message)
        # deltas carry only what is new and add up to the message
        assert "".join(d.content for d in deltas) == message.content
        assert "".join(d.reasoning for d in deltas) == message.reasoning
        check_chunks(message, deltas)
        # markup never leaks into content while streaming; only a call cut off before it
        # names a tool comes back, at the end, as the text it is
        cut = "cut before its name" in case.id
        for d in deltas if not cut else deltas[:-1]:
            assert "<tool_call>" not in d.content and "<think>" not in d.content


def test_content_streams_before_the_end() -> None:
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]))
    assert s.feed("Hello wor").content == "Hello wor"
    assert s.feed("ld <tool").content == "ld"  # " <tool" may start a call
    assert s.feed("kit> is fine").content == " <toolkit> is fine"


def test_only_a_bounded_tail_is_ever_held_back() -> None:
    """Fed token by token, the parser keeps at most a marker's length of undecided text,
    and inside a tool-call block it resumes its search where it stopped: linear work."""
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    s.feed("Sure")
    for i in range(5000):
        s.feed(f" w{i % 10}")
        assert len(s.buf) <= len("<tool_call>")
    s.feed(' <tool_call>{"name": "get_weather", "arguments": {"city": "')
    for _ in range(5000):
        s.feed("ab")
        assert s.buf == "" and s.args is not None and s.args.pos == len(s.block)
    s.feed('"}}</tool_call>')
    message = s.message
    assert len(message.content) > 10000 and len(message.tool_calls) == 1
    assert json.loads(message.tool_calls[0].arguments)["city"] == "ab" * 5000


def test_apply_schema_on_the_full_text_agrees() -> None:
    """The schema's own regexes, applied to a whole Hermes answer, give the same fields."""
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            "\n</tool_call>")
    parsed = apply_schema(SCHEMAS["qwen2.5-coder-0.5b"], text)
    assert parsed["role"] == "assistant" and parsed["content"] == "Let me check."
    assert parsed["tool_calls"] == [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]
    xml = ("<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
           "</function>\n</tool_call>")
    parsed = apply_schema(SCHEMAS["qwen3.5-0.8b"], xml)
    assert parsed["reasoning_content"] == "hm\n"
    assert parsed["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": "1"}}


def test_a_call_is_announced_as_soon_as_its_name_is_known() -> None:
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    assert not s.feed("<tool_call>\n{\"name\": \"get_wea")
    d = s.feed('ther", "arguments": {"ci')
    assert [(c.name, c.arguments) for c in d.calls] == [("get_weather", ""), ("", '{"ci')]
    d = s.feed('ty": "Rome"}')
    assert [c.arguments for c in d.calls] == ['ty": "Rome"}'] and not d.tool_calls
    d = s.feed("}\n</tool_call>")
    assert [c.done for c in d.calls] == [True]
    assert d.tool_calls[0].arguments == '{"city": "Rome"}'  # as the model wrote it


def test_a_call_cut_off_is_returned_incomplete() -> None:
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    s.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    tail = s.finish()
    assert tail.tool_calls == [s.message.tool_calls[0]]
    call = s.message.tool_calls[0]
    assert (call.name, call.arguments, call.complete) == ("get_weather", '{"city": "Par', False)


def test_bare_json_is_a_call_only_when_it_is_the_whole_answer() -> None:
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    assert not s.feed('{"name": "get_weather", "arguments": {"city": "Lim')  # held
    assert not s.feed('a"}}\n')  # the value closed: a call if nothing follows
    tail = s.finish()
    assert [(c.name, json.loads(c.arguments)) for c in tail.tool_calls] == [
        ("get_weather", {"city": "Lima"})]
    # a call followed by more text is an answer (the model went on, e.g. with a made-up
    # result), released as soon as the text after the value arrives
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    s.feed('{"name": "get_weather", "arguments": {"city": "Paris"}}\n')
    d = s.feed('{"response": "sunny"}')
    assert d.content.startswith('{"name": "get_weather"') and not s.finish().tool_calls
    assert not s.message.tool_calls
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    assert s.feed('{"answer": ').content == '{"answer":'  # not a call: streamed at once
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    assert not s.feed('```json\n{"na')  # may still be a call
    assert s.feed('me": "x", "arguments": {}}').content.startswith("```json")


def test_an_undecided_bare_json_head_is_released_after_a_bound() -> None:
    s = MessageStream(stream_layout(SCHEMAS["qwen2.5-coder-0.5b"]), tools=WEATHER)
    assert not s.feed("{" + " " * 100)  # still maybe a call
    assert s.feed(" " * 600 + "x").content.startswith("{")  # released: too long to decide

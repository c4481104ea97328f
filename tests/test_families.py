"""Model families read from the chat template alone (issue 46, parsers/families.py): every
template of llama.cpp's collection is read as the family its markup is, llama.cpp's own
parse expectations for each family (tests/family_cases.py) hold in the parser in any
chunking, and each family's forced calls, written by its grammar, read back as valid calls.

The server side (a tiny model per family carrying the real template, no config but the
file) is tests/test_families_server.py.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import numpy as np
import pytest
from family_cases import CASES, DERIVED, DETECTED, TOOLS, TYPED, ParseCase, family_of
from grammar_walk import GrammarWalker
from llama_templates import all_templates, template

from conftest import model_path
from engine.constraints.grammar import xml_tool_call_grammar
from engine.constraints.grammar_shapes import shaped_call_grammar
from parsers.call_items import MarkupValues, markup_values
from parsers.call_shape import json_type
from parsers.chat_template import ChatTemplate, TemplateError
from parsers.families import FAMILIES, by_name, detect
from parsers.message_stream import MessageDelta, MessageStream
from parsers.response_schema import StreamLayout, stream_layout
from parsers.template_probe import derive

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "note": {"type": "string", "maxLength": 8},
        "metric": {"type": "boolean"}},
    "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"const": "UTC"}}, "required": ["zone"]}}}
WALK_TOOLS = [WEATHER, TIME]


def layout_of(name: str) -> StreamLayout:
    return stream_layout(family_of(name).schema)


def opens_reasoning(case: ParseCase, layout: StreamLayout) -> bool:
    """Whether the template's prompt for this case ends inside a reasoning block (as
    api/chat/prepare.py decides it)."""
    kwargs = {} if case.thinking is None else {"enable_thinking": case.thinking}
    text = ChatTemplate(template(case.template), "<s>", "</s>").render(
        [{"role": "user", "content": "Hi"}], tools=case.body_tools(), **kwargs)
    opener = layout.reasoning_start
    return bool(opener and layout.reasoning_end and text.rstrip().endswith(opener))


def parse(layout: StreamLayout, text: str, chunks: list[str], in_reasoning: bool,
          tools: list[dict[str, Any]]) -> MessageDelta:
    stream = MessageStream(layout, in_reasoning=in_reasoning, tools=tools)
    for chunk in chunks:
        stream.feed(chunk)
    stream.finish("stop")
    return stream.message


def split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 16))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_every_vendored_template_is_read_as_its_family() -> None:
    names = all_templates()
    assert len(names) >= 70
    assert {n: (f.name if (f := detect(template(n))) else None) for n in names} == \
        {n: DETECTED.get(n, "not in the table") for n in names}


def test_the_shipped_configs_and_the_built_in_families_agree() -> None:
    """gpt-oss and Gemma 4 are the shipped configs' schemas; Qwen3.5's calls and Qwen2.5's
    are read by the same regexes as their configs'."""
    configs = {}
    for cfg, family in (("gpt-oss-120b", "gpt-oss"), ("gemma-4-12b-it-qat", "gemma4"),
                        ("qwen3.6-27b", "qwen3-xml"), ("qwen2.5-coder-0.5b", "hermes")):
        from pathlib import Path
        path = Path(__file__).resolve().parent.parent / "configs" / f"{cfg}.json"
        configs[family] = json.loads(path.read_text())["model"]["response_schema"]
    assert by_name("gpt-oss").schema == configs["gpt-oss"]
    assert by_name("gemma4").schema == configs["gemma4"]
    assert by_name("qwen3-xml").schema["properties"]["tool_calls"] == \
        configs["qwen3-xml"]["properties"]["tool_calls"]
    ours, theirs = (stream_layout(by_name("hermes").schema),
                    stream_layout(configs["hermes"]))
    assert (ours.call_start, ours.call_end) == (theirs.call_start, theirs.call_end)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_llama_cpp_parse_expectations_in_any_chunking(case: ParseCase) -> None:
    layout = layout_of(case.template)
    in_reasoning = opens_reasoning(case, layout)
    rng = random.Random(case.id)
    for chunks in ([case.text], list(case.text), *(split(case.text, rng) for _ in range(6))):
        got = parse(layout, case.text, chunks, in_reasoning, case.body_tools())
        assert (got.reasoning, got.content) == (case.reasoning, case.content), chunks
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == list(case.calls)


def test_markup_is_derived_where_no_family_matches() -> None:
    """For templates no built-in family matches, the markup is derived from the template's
    own rendering of probe calls and kept only if that rendering reads back exactly;
    which templates get one, and its markers."""
    got = {}
    for name in all_templates():
        if detect(template(name)) is not None:
            continue
        family = derive(ChatTemplate(template(name), "<s>", "</s>")).family
        if family is not None:
            lay = stream_layout(family.schema)
            got[name] = (lay.reasoning_end, lay.block_start or lay.call_start)
    assert got == DERIVED


SHAPED = [f for f in FAMILIES if f.shape is not None] + [family_of(n) for n in DERIVED]
SHAPED_IDS = [f.name for f in FAMILIES if f.shape is not None] + \
    [f"derived:{n.removesuffix('.jinja')}" for n in DERIVED]


@pytest.mark.parametrize("family", SHAPED, ids=SHAPED_IDS)
def test_a_call_written_in_the_family_shape_reads_back(family: Any) -> None:
    layout = stream_layout(family.schema)
    calls = [("get_weather", {"city": "Rome", "days": 3, "note": "a b"}),
             ("get_time", {"zone": "UTC"})]
    if not family.shape.marker or family.shape.single:  # one per answer
        calls = calls[:1]
    text = family.shape.render(calls)
    got = parse(layout, text, [text], False, WALK_TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == calls, text
    assert not got.content


@pytest.fixture(scope="module")
def walker() -> GrammarWalker:
    return GrammarWalker(str(model_path("smollm2")))


@pytest.mark.parametrize("family", SHAPED, ids=SHAPED_IDS)
def test_forced_calls_written_by_the_family_grammar_are_valid(family: Any,
                                                              walker: GrammarWalker) -> None:
    """Random walks through the forced-call grammar (llama.cpp's grammar sampler over
    random logits: what a random model could write): every walk that ends reads back as
    calls of offered tools whose arguments validate, in the family's own markup."""
    layout = stream_layout(family.schema)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in WALK_TOOLS}
    for parallel in (False, True):
        grammar = shaped_call_grammar(WALK_TOOLS, family.shape, parallel=parallel,
                                      lazy=False)
        ended = 0
        for seed in range(4):
            text = walker.walk(grammar.text, np.random.default_rng(seed), max_steps=400)
            if text is None:
                continue
            ended += 1
            got = parse(layout, text, [text], False, WALK_TOOLS)
            assert got.tool_calls and not got.content.strip(), text
            assert parallel or len(got.tool_calls) == 1
            for call in got.tool_calls:
                jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        assert ended >= 2, f"only {ended} of 4 walks ended"


PAIRED = [f for f in SHAPED if f.shape.pairs and not f.shape.json_values]


def _typed_walks(grammar: Any, layout: StreamLayout, walker: GrammarWalker,
                 written: MarkupValues) -> int:
    """Walks of ``grammar`` (TYPED forced) read back with ``markup_values``: every
    call's arguments validate; how many walks ended."""
    schema = TYPED["function"]["parameters"]
    ended = 0
    for seed in range(6):  # (the longest markup, Hy3's, takes ~500 steps a call)
        text = walker.walk(grammar.text, np.random.default_rng(seed), max_steps=1200)
        if text is None:
            continue
        ended += 1
        stream = MessageStream(layout, tools=[TYPED], markup_values=written)
        stream.feed(text)
        stream.finish("stop")
        assert stream.message.tool_calls, text
        for call in stream.message.tool_calls:
            jsonschema.validate(json.loads(call.arguments), schema)
    return ended


@pytest.mark.parametrize("family", [*PAIRED, by_name("qwen3-xml")],
                         ids=[*(f.name for f in PAIRED), "qwen3-xml"])
def test_markup_values_read_back_as_the_grammar_wrote_them(family: Any,
                                                            walker: GrammarWalker) -> None:
    """Key/value call markup (and Qwen3's XML) of parameters typed by no single ``type``:
    random walks of the strict forced-call grammar read back valid, with the grammar's
    record of which values it wrote as JSON (``Grammar.markup_values``)."""
    layout = stream_layout(family.schema)
    if family.shape is not None:
        grammar = shaped_call_grammar([TYPED], family.shape, parallel=False, lazy=False)
    else:
        assert layout.call_start and layout.call_end
        grammar = xml_tool_call_grammar([TYPED], layout.call_start, layout.call_end,
                                        parallel=False, lazy=False)
    written = markup_values(grammar.markup_values)
    assert set(written) == {"configure"}
    assert all(written["configure"][k] for k in ("level", "limit", "unit"))
    assert written["configure"]["word"] is False  # (an allOf merged into a string)
    assert _typed_walks(grammar, layout, walker, written) >= 3


def _read_back(layout: StreamLayout, tool: dict[str, Any], grammar: Any, text: str
               ) -> dict[str, Any]:
    stream = MessageStream(layout, tools=[tool],
                           markup_values=markup_values(grammar.markup_values))
    stream.feed(text)
    stream.finish("stop")
    assert len(stream.message.tool_calls) == 1, text
    return dict(json.loads(stream.message.tool_calls[0].arguments))


def _tool(parameters: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "strict": strict,
                                             "parameters": parameters}}


def test_markup_values_the_grammar_did_not_declare_keep_their_coercion(
        walker: GrammarWalker) -> None:
    """An open tool written as any parameters (a non-strict ``oneOf`` beside its
    properties) records no parameter: its values are coerced by the declared ``type``, as
    before the grammar's record existed."""
    tool = _tool({"type": "object", "properties": {"n": {"type": "integer"},
                                                   "q": {"type": "string"}},
                  "oneOf": [{"required": ["n"]}, {"required": ["q"]}]}, strict=False)
    family = by_name("minimax-m2")
    grammar = shaped_call_grammar([tool], family.shape, parallel=False, lazy=False)
    assert markup_values(grammar.markup_values) == {"f": {}}
    text = family.shape.render([("f", {"n": "5"})])
    assert walker.accepts(grammar.text, text)
    assert _read_back(stream_layout(family.schema), tool, grammar, text) == {"n": 5}


def test_a_json_string_cannot_hold_the_close_of_its_value(walker: GrammarWalker) -> None:
    """Key/value families whose value close holds "<": a JSON value's string written with
    a raw "<" could hold the close, where the parser's regex would end the value (a strict
    ``Optional[str]`` came back cut). The grammar writes "<" in strings as its escape."""
    tool = _tool({"type": "object", "properties": {"s": {"anyOf": [
        {"type": "string", "minLength": 8}, {"type": "null"}]}}, "required": ["s"],
        "additionalProperties": False})
    def call(shape: Any, value: str) -> str:  # s written as the JSON text ``value``
        body = f"{shape.key_open}s{shape.typed_key_close('string')}{value}" \
               f"{shape.close_value('s')}"
        head = shape.name_close.replace("{index}", "1")
        return f"{shape.section_open.lstrip()}{shape.call_open}f{head}{body}{shape.call_close}" \
               f"{shape.section_close}"

    for family in PAIRED:
        layout = stream_layout(family.schema)
        grammar = shaped_call_grammar([tool], family.shape, parallel=False, lazy=False)
        close = family.shape.close_value("s").rstrip("\n")  # (where the parser stops)
        assert walker.accepts(grammar.text, call(family.shape, '"abcdefgh"')), family.name
        assert not walker.accepts(grammar.text, call(family.shape, f'"ab{close}cdefgh"'))
        escaped = call(family.shape, '"a\\u003cb ' + "c" * 8 + '"')
        assert walker.accepts(grammar.text, escaped), (family.name, escaped)
        assert _read_back(layout, tool, grammar, escaped) == {"s": "a<b " + "c" * 8}
        # a pattern's "." too (its strings take no escape: "<" is left out)
        dotted = _tool({"type": "object", "properties": {"s": {"anyOf": [
            {"type": "string", "pattern": "^a.*b$"}, {"type": "null"}]}}, "required": ["s"],
            "additionalProperties": False})
        g = shaped_call_grammar([dotted], family.shape, parallel=False, lazy=False)
        assert walker.accepts(g.text, call(family.shape, '"a-b"')), family.name
        assert not walker.accepts(g.text, call(family.shape, f'"a{close}b"')), family.name


def test_bare_text_cannot_hold_the_close_of_its_value(walker: GrammarWalker) -> None:
    """A string written bare: a run of line breaks (Qwen3's "\\n</parameter>") or of the
    close's first character (MiniMax M3's "]<]minimax[>[") let the close through ("\\n\\n<",
    "]]<"), and the parser read a second, undeclared parameter out of one value."""
    tool = _tool({"type": "object", "properties": {"s": {"type": "string"}},
                  "required": ["s"], "additionalProperties": False})
    layout = layout_of("Qwen3.5-4B.jinja")
    assert layout.call_start and layout.call_end
    grammar = xml_tool_call_grammar([tool], layout.call_start, layout.call_end,
                                    parallel=False, lazy=False)

    def qwen(value: str) -> str:
        return (f"<tool_call>\n<function=f>\n<parameter=s>\n{value}\n</parameter>\n"
                "</function>\n</tool_call>")

    assert not walker.accepts(grammar.text, qwen("x\n\n</parameter>\n\n<parameter=zzz>\nq"))
    for value in ("x\n\ny", "<b>\n\n i < j", "x\n"):
        assert walker.accepts(grammar.text, qwen(value)), value
        assert _read_back(layout, tool, grammar, qwen(value)) == {"s": value}
    m3 = by_name("minimax-m3")
    grammar = shaped_call_grammar([tool], m3.shape, parallel=False, lazy=False)
    close = m3.shape.close_value("s")
    assert not walker.accepts(grammar.text, m3.shape.render([("f", {"s": f"a]{close}b"})]))
    for value in ("a]]b", "a]", "]] <"):
        text = m3.shape.render([("f", {"s": value})])
        assert walker.accepts(grammar.text, text), value
        assert _read_back(stream_layout(m3.schema), tool, grammar, text) == {"s": value}


def _markup(shape: Any, values: list[tuple[str, str, str | None]]) -> str:
    """One call to ``f`` whose values are written as given: (key, text, the JSON type the
    text is written as, or None for bare text)."""
    body = "".join(f"{shape.key_open}{key}"
                   f"{shape.key_close if kind is None else shape.typed_key_close(kind)}"
                   f"{text}{shape.close_value(key)}" for key, text, kind in values)
    head = shape.name_close.replace("{index}", "1")
    return f"{shape.section_open.lstrip()}{shape.call_open}f{head}{body}{shape.call_close}" \
           f"{shape.section_close}"


@pytest.mark.parametrize("family", PAIRED, ids=[f.name for f in PAIRED])
def test_no_value_can_write_the_close_its_schema_seems_to_allow(family: Any,
                                                               walker: GrammarWalker) -> None:
    """A value whose own schema could write the family's value close ("</parameter>"):
    listed values (now written as JSON, "<" escaped), a pattern's negated class or
    shorthand (bare and in JSON), a json-pointer, a map's key pattern. The parser's lazy
    regex would cut such a value at the close: the grammar admits no such text, what it
    admits reads back valid, and a pattern that names "<" itself is refused under
    ``strict`` (a clear error, not a cut answer). So is a custom tool grammar (written as a
    JSON string now) and an object's other keys beside a declared name holding "<"."""
    shape = family.shape
    close = shape.close_value("v").rstrip("\n")
    listed = ["plain", f"a{close}b", "x<y"]
    params = {"type": "object", "additionalProperties": False, "properties": {
        "e": {"enum": listed},
        "p": {"type": "string", "pattern": "^[^q]{1,40}$"},
        "s": {"type": "string", "pattern": "^\\S{1,40}$"},
        "n": {"anyOf": [{"type": "string", "pattern": "^[^q]{1,40}$"}, {"type": "null"}]},
        "j": {"type": "string", "format": "json-pointer", "maxLength": 40},
        "m": {"type": "object", "patternProperties": {"^[^q]{1,30}$": {"type": "integer"}},
              "additionalProperties": False, "maxProperties": 1},
        "c": {"type": "string", "x-custom-grammar": {"syntax": "regex",
                                                     "definition": "[^q\\n]{1,60}"}},
        "o": {"type": "object", "properties": {"<b": {"type": "integer"}},
              "additionalProperties": {"type": "integer"}}}}
    tool = _tool({**params, "required": list(params["properties"])})
    layout = stream_layout(family.schema)
    grammar = shaped_call_grammar([tool], shape, parallel=False, lazy=False)
    written = markup_values(grammar.markup_values)["f"]
    assert written["e"] is True and written["p"] is False  # listed values holding "<": JSON
    assert written["c"] is True  # a custom grammar: JSON, "<" escaped
    good = {"e": f"a{close}b", "p": "a b", "s": "a/b", "n": "ab", "j": "/a", "m": {"k": 1},
            "c": "a<b", "o": {"<b": 1}}

    def text(values: dict[str, Any], raw: str = "") -> str:
        """The call, each value bare or as JSON as the grammar writes it ("<" escaped, but
        in the value of ``raw``)."""
        return _markup(shape, [
            (k, v if not written[k] else json.dumps(v, ensure_ascii=False).replace(
                "<", "<" if k == raw else "\\u003c"), None if not written[k] else json_type(v))
            for k, v in values.items()])

    assert walker.accepts(grammar.text, text(good)), text(good)
    args = _read_back(layout, tool, grammar, text(good))
    assert args == good
    jsonschema.validate(args, tool["function"]["parameters"])
    inside = {"e": f"a{close}b", "p": f"a{close}b", "s": f"a{close}b", "n": f"a{close}b",
              "j": f"/a{close}", "m": {f"k{close}": 1}, "c": f"a{close}b",
              "o": {close if close.startswith("<") else f"k{close}": 1}}
    for key, bad in inside.items():
        assert not walker.accepts(grammar.text, text({**good, key: bad}, raw=key)), \
            (family.name, key)
        assert walker.accepts(grammar.text, text({**good, key: good[key]}, raw=key)) == (
            "<" not in json.dumps(good[key], ensure_ascii=False) or not written[key]), \
            (family.name, key)  # (the raw text's only fault is the close)
    for seed in range(3):  # what the grammar writes reads back valid
        walked = walker.walk(grammar.text, np.random.default_rng(seed), max_steps=2000)
        if walked is not None:
            jsonschema.validate(_read_back(layout, tool, grammar, walked),
                                tool["function"]["parameters"])
    named = _tool({"type": "object", "properties": {"t": {"type": "string",
                                                          "pattern": "^<[a-z]+>$"}}})
    with pytest.raises(ValueError, match="closes a value"):
        shaped_call_grammar([named], shape, parallel=False, lazy=False)


def test_a_nul_escape_reads_back_as_json() -> None:
    """``\u0000`` is JSON the grammar writes; read back as the string it is, not as the
    text of its quotes (the server's own JSON reader refuses NUL)."""
    tool = _tool({"type": "object", "properties": {"s": {"anyOf": [
        {"type": "string", "maxLength": 2}, {"type": "null"}]}}, "required": ["s"],
        "additionalProperties": False})
    layout = layout_of("Qwen3.5-4B.jinja")
    assert layout.call_start and layout.call_end
    grammar = xml_tool_call_grammar([tool], layout.call_start, layout.call_end,
                                    parallel=False, lazy=False)
    text = ('<tool_call>\n<function=f>\n<parameter=s>\n"\\u0000"\n</parameter>\n'
            '</function>\n</tool_call>')
    assert _read_back(layout, tool, grammar, text) == {"s": "\x00"}


def test_lazy_family_grammar_waits_for_the_marker() -> None:
    g = shaped_call_grammar(WALK_TOOLS, by_name("kimi-k2").shape, parallel=True, lazy=True)
    assert g.lazy_patterns == (r"(<\|tool_calls_section_begin\|>)",)
    g = shaped_call_grammar(WALK_TOOLS, by_name("firefunction").shape, parallel=True,
                            lazy=True)
    assert g.lazy_patterns == (r"(functools\[)",)
    rules = dict(line.split(" ::= ", 1) for line in g.text.splitlines())
    assert rules["root"].startswith('" "? "functools["')


WEATHER_CALL = {"id": "call_Wq8x2", "type": "function",
                "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}
CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hi"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "multi-turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                   {"role": "user", "content": "And?"}],
    # as the OpenAI SDK sends a call and its result (the server parses the arguments)
    "tool call": [{"role": "user", "content": "Call it."},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {**WEATHER_CALL, "function": {"name": "special_function",
                                                    "arguments": {"arg1": 1}}}]},
                  {"role": "tool", "tool_call_id": "call_Wq8x2", "content": "done"}],
}
# what each template needs before it takes a tool conversation (parsers/template_adapt.py)
ADAPTED = {
    "Bielik-11B-v3.0-Instruct.jinja": ["empty_content"],
    "LFM2.5-8B-A1B.jinja": ["empty_content"],
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ["short_ids"],
    "Qwen-QwQ-32B.jinja": ["empty_content"],
    "Qwen-Qwen3-0.6B.jinja": ["empty_content"],
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ["empty_content"],
    "google-gemma-2-2b-it.jinja": ["tools_as_text"],
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ["empty_content"],
    "meetkai-functionary-medium-v3.2.jinja": ["text_arguments"],
    "microsoft-Phi-3.5-mini-instruct.jinja": ["empty_content"],
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ["empty_content"],
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ["short_ids"],
    "openai-gpt-oss-120b.jinja": ["empty_content"],
    "unsloth-mistral-Devstral-Small-2507.jinja": ["empty_content"],
}


def test_every_vendored_template_takes_the_conversations_clients_send() -> None:
    """Four conversations, with tools offered and without, on every template of llama.cpp's
    collection: all render, adapted where the template cannot take them as sent (null
    content, arguments as text, Mistral's 9-character ids, tool turns as text for a template
    without them, a ``tools`` list where the template iterates it unchecked,
    ``{% generation %}``, FireFunction's ``functions``, a generator given to ``tojson``,
    lists a template changes, a system message folded into the first user turn, a
    ``description`` where Command R+'s template writes one unchecked)."""
    failed, adapted = [], {}
    for name in all_templates():
        chat = ChatTemplate(template(name), "<s>", "</s>")
        for what, messages in CONVERSATIONS.items():
            for tools in (None, [TOOLS["special_function"]]):
                try:
                    chat.render(messages, tools=tools)
                except TemplateError:
                    failed.append(f"{name} {what}{' tools' if tools else ''}")
        if chat.adaptations:
            adapted[name] = chat.adaptations.names()
    assert not failed
    assert adapted == ADAPTED


def test_adapted_conversations_keep_what_the_client_said() -> None:
    """The adaptations change the form, never the facts: Mistral's ids pair a call with its
    result, Gemma 2 sees the call and its result as text, text arguments are the same JSON,
    and a conversation the template takes as sent is rendered as sent."""
    conv = CONVERSATIONS["tool call"]
    nemo = ChatTemplate(template("mistralai-Mistral-Nemo-Instruct-2407.jinja"), "<s>", "</s>")
    text = nemo.render(conv, tools=[TOOLS["special_function"]])
    ids = re.findall(r'"(?:call_)?id": "(\w+)"', text)
    assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 9, text
    gemma = ChatTemplate(template("google-gemma-2-2b-it.jinja"), "<s>", "</s>")
    text = gemma.render(conv, tools=[TOOLS["special_function"]])
    assert '"tool_calls": [{"name": "special_function", "arguments": {"arg1": 1}}]' in text
    assert '"tool_response"' in text and "done" in text
    with pytest.raises(TemplateError, match="alternate"):  # two user turns stay two
        gemma.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    fn = ChatTemplate(template("meetkai-functionary-medium-v3.2.jinja"), "<s>", "</s>")
    assert '{"arg1": 1}' in fn.render(conv, tools=[TOOLS["special_function"]])
    qwen = ChatTemplate(template("Qwen-Qwen2.5-7B-Instruct.jinja"), "<s>", "</s>")
    assert not qwen.adaptations


def test_prompts_are_transformers_own_wherever_transformers_renders() -> None:
    """The same four conversations, with and without tools, through transformers' own
    ``render_jinja_template`` on every vendored template: wherever transformers renders one,
    llamaserve's prompt is identical (the adaptations only apply where the template
    refuses the conversation as sent, which transformers cannot render either)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    same, differ = 0, []
    for name in all_templates():
        chat = ChatTemplate(template(name), "<s>", "</s>")
        for what, messages in CONVERSATIONS.items():
            for tools in (None, [TOOLS["special_function"]]):
                try:
                    theirs = render_jinja_template(
                        conversations=[messages], tools=tools, chat_template=template(name),
                        add_generation_prompt=True, bos_token="<s>", eos_token="</s>")[0][0]
                except Exception:  # transformers cannot render it (adapted here)
                    continue
                if chat.render(messages, tools=tools) == theirs:
                    same += 1
                else:
                    differ.append(f"{name} {what}{' tools' if tools else ''}")
    assert not differ
    assert same >= 450  # of 568: the rest transformers cannot render

"""Thinking, tools and structured output together on gpt-oss's harmony, Gemma 4 and
Qwen3.5's XML calls (issue 34): the shipped configs' own templates and response schemas on
tiny random-weight models whose tokenizer holds each family's control tokens
(tests/make_family_models.py). Nothing
but the budget and the grammar guide those models, so every seeded answer must be valid:
calls in ``tool_calls`` (Anthropic ``tool_use``, Responses ``function_call``) with arguments
valid against their schema, JSON in ``content``, thinking in ``reasoning_content`` and none
of the family's markup in the answer (tests/plan_cases.py says what valid is; the bench
bench/thinking_tools.py runs 100 seeds per case against llama-server too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from grammar_walk import TextChecker
from make_family_models import server_config
from make_tiny_model import write_tiny_model
from openai import OpenAI
from plan_cases import (
    ANSWER,
    BUDGET,
    CASES,
    MARKUP,
    MAX_TOKENS,
    TOOLS,
    WEATHER,
    Case,
    problem,
    read_stream,
    request,
)

from conftest import ServerProcess, start_server
from engine.constraints.grammar import harmony_grammar, json_grammar
from engine.constraints.grammar_gemma4 import gemma4_call_grammar
from parsers import gemma4
from parsers.harmony import HarmonyParser

FAMILIES = ["harmony", "gemma4", "qwen35"]  # (Hermes: tests/test_api_tools.py, a real model)
SEEDS = range(2)  # CI time: bench/thinking_tools.py runs 100 seeds per case
STREAM_SEEDS = (2,)  # streamed answers take other seeds: the parser agrees either way


# -- pure: the family's markup through the parser and the grammar -----------------------


def test_gemma4_values_read_what_the_template_writes() -> None:
    value = {"city": "Paris", "days": 3, "tags": ["a,b", "}"], "deep": {"x": None, "y": True},
             "f": -1.5}
    assert gemma4.parse_value(gemma4.dumps(value)) == value
    assert gemma4.parse_value("{city:<|\"|>Rome<|\"|>") is None  # cut off: not a value
    assert gemma4.parse_value("{a:1} tail") is None


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_harmony_channels_in_any_chunking(size: int) -> None:
    text = ("I should call it.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_time <|constrain|>json<|message|>{"zone": "UTC"}')
    parser = HarmonyParser(in_reasoning=True)
    pieces = [parser.feed(text[i:i + size]) for i in range(0, len(text), size)]
    pieces.append(parser.finish())
    assert "".join(p.reasoning for p in pieces) == "I should call it."
    assert not "".join(p.content for p in pieces)
    calls = [c for p in pieces for c in p.tool_calls]
    assert [(c.name, json.loads(c.arguments), c.complete) for c in calls] == \
        [("get_time", {"zone": "UTC"}, True)]
    streamed = "".join(c.arguments for p in pieces for c in p.calls)
    assert streamed == calls[0].arguments
    # gpt-oss also writes the recipient before the channel; a final answer is content
    parser = HarmonyParser(in_reasoning=False)
    out = parser.feed("<|channel|>analysis<|message|>hm<|end|><|start|>assistant "
                      "to=functions.get_weather<|channel|>commentary json<|message|>{}")
    out.extend(parser.finish())
    assert out.reasoning == "hm" and out.tool_calls[0].name == "get_weather"
    parser = HarmonyParser(in_reasoning=True)
    out = parser.feed("x<|end|><|start|>assistant<|channel|>final<|message|>Hello")
    out.extend(parser.finish())
    assert (out.reasoning, out.content, out.tool_calls) == ("x", "Hello", [])
    parser = HarmonyParser(in_reasoning=False)  # no header at all: content as it is
    out = parser.feed("plain words")
    out.extend(parser.finish())
    assert (out.reasoning, out.content) == ("", "plain words")


def test_family_grammars_wait_for_the_end_of_reasoning_and_type_the_values() -> None:
    g = harmony_grammar(TOOLS, forced=True, schema=None, json_mode=False, after="<|end|>")
    rules = dict(line.split(" ::= ", 1) for line in g.text.splitlines())
    assert rules["root"] == '"<|end|><|start|>assistant" (call)' and "final" not in rules
    assert g.lazy_patterns == ("(<\\|end\\|>)",)
    g = gemma4_call_grammar(TOOLS, "<|tool_call>", "<tool_call|>", parallel=False,
                            lazy=False, after="<channel|>")
    rules = dict(line.split(" ::= ", 1) for line in g.text.splitlines())
    assert rules["root"].startswith('"<channel|>"')
    assert '"city:" ("<|\\"|>Paris<|\\"|>" | "<|\\"|>Rome<|\\"|>" | "<|\\"|>Oslo<|\\"|>")' \
        in g.text  # enum in Gemma 4's own strings
    assert rules["fn0-args-2"] == '"<|\\"|>" g4-char{0,6} "<|\\"|>"'  # maxLength


def test_gemma4_arguments_come_in_the_schemas_order() -> None:
    """Gemma 4's call arguments, like JSON objects (engine/constraints/schema_converter.py),
    in the order the schema lists them, optional ones present or not: the required one
    first was the old order, which made a model answer before the reasoning asked first."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["answer"], "properties": {
            "reason": {"type": "string", "maxLength": 8}, "answer": {"type": "integer"},
            "note": {"type": "string", "maxLength": 8}}}}}
    g = gemma4_call_grammar([tool], "<|tool_call>", "<tool_call|>", parallel=False,
                            lazy=False)
    checker = TextChecker(str(write_tiny_model()))  # (any vocabulary: text is text)
    try:
        def call(args: str) -> str:
            return "<|tool_call>call:f{" + args + "}<tool_call|>"

        q = '<|"|>'
        for args in (f"reason:{q}why{q},answer:3", "answer:3", f"answer:3,note:{q}n{q}",
                     f"reason:{q}a{q},answer:-1,note:{q}b{q}"):
            assert checker.accepts(g.text, call(args)), args
        for args in (f"answer:3,reason:{q}why{q}", f"note:{q}n{q},answer:3", "",
                     f"reason:{q}a{q}", f"answer:3,,note:{q}b{q}"):
            assert not checker.accepts(g.text, call(args)), args
    finally:
        checker.close()


def test_json_strings_hold_no_raw_control_characters() -> None:
    """The converter let a raw line break into a JSON string (json.loads refuses it): seen
    in a harmony call's arguments on the random model before the rule was tightened."""
    rules = dict(line.split(" ::= ", 1) for line in json_grammar(ANSWER).text.splitlines())
    assert rules["char"].startswith('[^"\\\\\\x7F\\x00-\\x1F]'), rules["char"]


# -- through the server ------------------------------------------------------------------


@pytest.fixture(scope="module", params=FAMILIES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, ServerProcess]]:
    family = request.param
    srv = start_server(server_config(family), tmp_path_factory.mktemp(family))
    yield family, srv
    srv.stop()


def ask(srv: ServerProcess, case: Case, seed: int, stream: bool
        ) -> tuple[dict[str, Any], str | None]:
    body = request(case, seed, stream)
    if not stream:
        r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"], choice["finish_reason"]
    with httpx.stream("POST", srv.base_url + "/chat/completions", json=body,
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        return read_stream(r.iter_lines())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_seeded_answer_is_valid(server: tuple[str, ServerProcess], case: Case,
                                      stream: bool) -> None:
    family, srv = server
    for seed in STREAM_SEEDS if stream else SEEDS:
        message, finish = ask(srv, case, seed, stream)
        assert problem(family, case, message, finish) is None, (seed, message, finish)


def test_a_budget_closes_the_reasoning_with_the_answer_in_room(
        server: tuple[str, ServerProcess]) -> None:
    family, srv = server
    case = next(c for c in CASES if c.name == "none, budget")
    r = httpx.post(srv.base_url + "/chat/completions", timeout=60, json={
        **request(case, 0), "thinking_budget_tokens": 4, "max_tokens": 30})
    out = r.json()
    assert out["usage"]["completion_tokens"] == 30, out  # the answer had its room
    assert out["choices"][0]["message"]["content"], out
    for marker in MARKUP[family]:
        assert marker not in out["choices"][0]["message"]["content"]


def test_responses_forced_call_and_text_format(server: tuple[str, ServerProcess]) -> None:
    family, srv = server
    client = OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    tools = [{"type": "function", "name": t["function"]["name"],
              "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]
    # thinking on: Gemma 4 by effort; Qwen3.5's template reads "low" as off, so by its switch
    thinking: dict[str, Any] = {} if family == "qwen35" else {"reasoning": {"effort": "low"}}
    switch = {"chat_template_kwargs": {"enable_thinking": True}} if family == "qwen35" else {}
    for seed in SEEDS:
        r = client.responses.create(
            model="m", input="Weather?", tools=tools,  # type: ignore[arg-type]
            tool_choice="required", max_output_tokens=MAX_TOKENS, temperature=1.0,
            parallel_tool_calls=False, **thinking,
            extra_body={"thinking_budget_tokens": BUDGET, "seed": seed, **switch})
        kinds = [item.type for item in r.output]
        assert "reasoning" in kinds and kinds[-1] == "function_call", (family, kinds)
        call = r.output[-1]
        jsonschema.validate(json.loads(call.arguments),  # type: ignore[union-attr]
                            WEATHER if call.name == "get_weather" else  # type: ignore[union-attr]
                            TOOLS[1]["function"]["parameters"])
        r = client.responses.create(
            model="m", input="Weather?", max_output_tokens=MAX_TOKENS, temperature=1.0,
            text={"format": {"type": "json_schema", "name": "answer",  # type: ignore[typeddict-item]
                             "schema": ANSWER}}, **thinking,
            extra_body={"thinking_budget_tokens": BUDGET, "seed": seed, **switch})
        jsonschema.validate(json.loads(r.output_text), ANSWER)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropic_thinking_budget_and_tool_choice_any(server: tuple[str, ServerProcess],
                                                       stream: bool) -> None:
    family, srv = server
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for seed in SEEDS:
        ask_: dict[str, Any] = dict(
            model="m", max_tokens=MAX_TOKENS, tools=tools,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            thinking={"type": "enabled", "budget_tokens": BUDGET},
            messages=[{"role": "user", "content": "Weather?"}], extra_body={"seed": seed})
        if stream:
            with client.messages.stream(**ask_) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**ask_)
        kinds = [b.type for b in msg.content]
        assert kinds[0] == "thinking" and "tool_use" in kinds, (family, kinds)
        use = next(b for b in msg.content if b.type == "tool_use")
        jsonschema.validate(use.input, WEATHER if use.name == "get_weather" else
                            TOOLS[1]["function"]["parameters"])
        assert msg.stop_reason == "tool_use"


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/chat/completions", {"thinking_budget_tokens": -1}, "thinking_budget_tokens"),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": -1}},
     "thinking.budget_tokens"),
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "no_such_tool"}}}, "tool_choice"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "strict": True, "schema": {"type": "string", "pattern": "^(?=a)b$"}}}},
     "response_format"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "description": "F.", "strict": True, "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)b$"}},
            "required": ["s"]}}}], "tool_choice": "required"}, "tools"),
])
def test_bad_input_is_a_400_naming_the_field(server: tuple[str, ServerProcess], route: str,
                                             body: dict[str, Any], param: str) -> None:
    _, srv = server
    base = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(srv.url + route, json={**base, **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert param in (error.get("param") or error.get("message", "")), error
    ok = httpx.post(srv.url + "/v1/chat/completions", json=base, timeout=30)
    assert ok.status_code == 200  # and the server goes on

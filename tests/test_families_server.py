"""Every model family with ``-m`` alone, through the real server and the OpenAI SDK (issue
46): one tiny random-weight GGUF per llama.cpp template (tests/make_family_models.py), its
config nothing but the file, all served by one server (several models).

- llama.cpp's parse expectations (tests/family_cases.py): the model is made to write the
  case's text by a ``grammar`` (llama-server's field), and the answer must come back as
  the case's content, reasoning and calls, streamed and not;
- per family: ``tool_choice: required`` and a named tool give valid calls in the family's
  markup, ``json_schema`` gives valid JSON, and a thinking budget closes the reasoning of
  a family whose prompt opens it. Nothing but the grammar and the budget guide a random
  model, so every seeded answer must be valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from family_cases import CASES, DERIVED, DETECTED, TYPED, ParseCase, family_of
from make_family_models import write_template_model
from openai import BadRequestError, OpenAI
from plan_cases import TIME
from plan_cases import WEATHER as PLAN_WEATHER

from conftest import ServerProcess, start_server
from engine.constraints.grammar import _gbnf_literal

# one template per family for the plan checks (a forced call, JSON, a budget)
FAMILY_TEMPLATES = {
    "hermes": "Qwen-Qwen3-0.6B.jinja", "qwen3-xml": "Qwen3.5-4B.jinja",
    "seed-oss": "ByteDance-Seed-OSS.jinja", "glm": "GLM-4.7-Flash.jinja",
    "minimax-m3": "MiniMax-M3.jinja", "minimax-m2": "MiniMax-M2.jinja",
    "minimax-m1": "MiniMax-M1.jinja",
    "kimi-k2": "Kimi-K2-Thinking.jinja", "kimi-k3": "Kimi-K3.jinja",
    "gigachat-3": "GigaChat3-10B-A1.8B.jinja", "gigachat-3.1": "GigaChat3.1-10B-A1.8B.jinja",
    "deepseek-v3.1": "deepseek-ai-DeepSeek-V3.1.jinja",
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "mistral": "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "command-r7b": "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
    "command-r-plus": "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
    "granite-3.3": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "nemotron-v2": "NVIDIA-Nemotron-Nano-v2.jinja", "apertus": "Apertus-8B-Instruct.jinja",
    "apriel": "unsloth-Apriel-1.5.jinja", "firefunction":
        "fireworks-ai-llama-3-firefunction-v2.jinja",
    "functionary-3.1": "meetkai-functionary-medium-v3.1.jinja",
    "functionary-3.2": "meetkai-functionary-medium-v3.2.jinja",
    "smollm3": "HuggingFaceTB-SmolLM3-3B.jinja",  # no call markup: bare JSON calls
    "llama3": "meta-llama-Llama-3.2-3B-Instruct.jinja", "lfm2": "LFM2.5-8B-A1B.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja", "gemma4": "google-gemma-4-31B-it.jinja",
    # no built-in family: markup derived from the template (parsers/template_probe.py)
    "derived:deepseek-v3.2": "deepseek-ai-DeepSeek-V3.2.jinja",
    "derived:minicpm5": "openbmb-MiniCPM5-1B.jinja",
    "derived:hy3": "tencent-Hy3.jinja", "derived:solar": "upstage-Solar-Open-100B.jinja",
}
# issue 34's tools (tests/plan_cases.py), the days bounded
WEATHER = {**PLAN_WEATHER, "properties": {**PLAN_WEATHER["properties"],
                                          "days": {"type": "integer", "minimum": 1,
                                                   "maximum": 7}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time.",
                                           "parameters": TIME}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12},
                                           "level": {"enum": ["low", "high"]}},
          "required": ["answer", "level"], "additionalProperties": False}
BUDGET = 10
MAX_TOKENS = 200
# a forced call or a JSON answer after reasoning the prompt opened: a budget keeps the
# random model's thinking short (without one it would get half of max_tokens)
THINK = {"thinking_budget_tokens": 24}


def alias(template: str) -> str:
    return template.removesuffix(".jinja")


# templates adapted before they take a tool conversation (tests/test_families.py ADAPTED)
ADAPTED = ("google-gemma-2-2b-it.jinja", "meetkai-functionary-medium-v3.2.jinja",
           "microsoft-Phi-3.5-mini-instruct.jinja", "LFM2.5-8B-A1B.jinja",
           "poolside-Laguna-XS.2.jinja")
TEMPLATES = sorted({c.template for c in CASES} | set(FAMILY_TEMPLATES.values()) | set(ADAPTED))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    models = [{"alias": alias(t), "path": str(write_template_model(t)), "n_ctx": 4096,
               "n_seq_max": 2, "threads": 2, "threads_batch": 2, "n_gpu_layers": 0,
               "flash_attn": False} for t in TEMPLATES]
    srv = start_server({"server": {"max_loaded_models": len(models)}, "models": models},
                       tmp_path_factory.mktemp("families"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def ask(client: OpenAI, model: str, stream: bool, **body: Any) -> tuple[dict[str, Any], str]:
    """The answer's message (content, reasoning_content, tool_calls) and finish reason."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 400, **body}
    extra = {k: body.pop(k) for k in ("grammar", "chat_template_kwargs",
                                      "thinking_budget_tokens") if k in body}
    if not stream:
        r = client.chat.completions.create(model=model, extra_body=extra, **body)
        m = r.choices[0].message
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in m.tool_calls or []]
        return {"content": m.content or "", "reasoning_content":
                (m.model_extra or {}).get("reasoning_content") or "",
                "tool_calls": calls}, str(r.choices[0].finish_reason)
    content, reasoning, finish = "", "", ""
    parts: dict[int, dict[str, str]] = {}
    for chunk in client.chat.completions.create(model=model, extra_body=extra, stream=True,
                                                **body):
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for c in d.tool_calls or []:
                entry = parts.setdefault(c.index, {"name": "", "arguments": ""})
                entry["name"] += (c.function.name or "") if c.function else ""
                entry["arguments"] += (c.function.arguments or "") if c.function else ""
            finish = choice.finish_reason or finish
    return {"content": content, "reasoning_content": reasoning,
            "tool_calls": [parts[i] for i in sorted(parts)]}, str(finish)


def thinking(case: ParseCase) -> dict[str, Any]:
    if case.thinking is None:
        return {}
    return {"chat_template_kwargs": {"enable_thinking": case.thinking}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_llama_cpp_parse_expectations_through_the_server(client: OpenAI, case: ParseCase,
                                                          stream: bool) -> None:
    message, finish = ask(client, alias(case.template), stream, tools=case.body_tools(),
                          grammar=f"root ::= {_gbnf_literal(case.text)}", **thinking(case))
    assert (message["reasoning_content"], message["content"]) == \
        (case.reasoning, case.content)
    assert [(c["name"], json.loads(c["arguments"])) for c in message["tool_calls"]] == \
        list(case.calls)
    assert finish == ("tool_calls" if case.calls else "stop")


def test_models_report_their_family(server: ServerProcess) -> None:
    r = httpx.get(server.base_url + "/models", timeout=30).json()
    loaded = {m["id"]: m["meta"] for m in r["data"] if m["meta"].get("loaded")}
    assert loaded, r
    for name, meta in loaded.items():
        expected = "derived" if f"{name}.jinja" in DERIVED else DETECTED[f"{name}.jinja"]
        assert meta.get("family") == expected, (name, meta)
        # SmolLM3's template writes no calls: no tools capability
        assert ("tools" in meta["capabilities"]) == (expected != "smollm3"), (name, meta)


def test_thinking_is_a_capability_where_the_template_writes_it(server: ServerProcess) -> None:
    """Qwen2.5's template shares Qwen3's family but writes no reasoning block: Ollama's
    ``/api/show`` and ``/v1/models`` say thinking for Qwen3, Magistral and Seed-OSS only."""
    thinking = {}
    for name in ("Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
                 "mistralai-Ministral-3-14B-Reasoning-2512", "ByteDance-Seed-OSS"):
        r = httpx.post(f"{server.url}/api/show", json={"model": name}, timeout=60)
        assert r.status_code == 200, r.text
        thinking[name] = "thinking" in r.json()["capabilities"]
        assert "tools" in r.json()["capabilities"]
    assert thinking == {"Qwen-Qwen2.5-7B-Instruct": False, "Qwen-Qwen3-0.6B": True,
                        "mistralai-Ministral-3-14B-Reasoning-2512": True,
                        "ByteDance-Seed-OSS": True}


def markup(family: str) -> list[str]:
    from parsers.response_schema import stream_layout

    lay = stream_layout(family_of(FAMILY_TEMPLATES[family]).schema)
    return [m for m in (lay.call_start, lay.call_end, lay.block_start, lay.block_end,
                        lay.reasoning_end) if m]


def check_calls(family: str, message: dict[str, Any], finish: str, named: str | None) -> None:
    assert finish == "tool_calls" and message["tool_calls"], (message, finish)
    for marker in markup(family):
        assert marker not in message["content"], message
    for call in message["tool_calls"]:
        assert call["name"] in SCHEMAS and named in (None, call["name"]), call
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


FAMILIES = sorted(FAMILY_TEMPLATES)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("family", FAMILIES)
def test_forced_calls_are_valid_in_the_family_markup(client: OpenAI, family: str,
                                                      stream: bool) -> None:
    model = alias(FAMILY_TEMPLATES[family])
    for seed in (1,) if stream else (1, 2):  # (CI time: the parser agrees either way)
        message, finish = ask(client, model, stream, tools=TOOLS, tool_choice="required",
                              seed=seed, temperature=1.0, parallel_tool_calls=False,
                              max_tokens=MAX_TOKENS, **THINK)
        check_calls(family, message, finish, None)
        assert len(message["tool_calls"]) == 1
    message, finish = ask(client, model, stream, tools=TOOLS, seed=3, temperature=1.0,
                          tool_choice={"type": "function", "function": {"name": "get_time"}},
                          max_tokens=MAX_TOKENS, **THINK)
    check_calls(family, message, finish, "get_time")


# families whose call markup writes string values bare (key/value pairs, Qwen3's XML)
BARE_VALUES = ("qwen3-xml", "seed-oss", "glm", "minimax-m3", "minimax-m2", "kimi-k3")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("family", BARE_VALUES)
def test_markup_values_come_back_as_the_grammar_wrote_them(client: OpenAI, family: str,
                                                            stream: bool) -> None:
    """A strict tool whose parameters no single ``type`` describes (a typeless enum,
    ``Optional[int]``, a ``$ref`` to an integer enum, a string-or-integer, a merged
    ``allOf``), forced through the SDK: the arguments validate, each value read back as
    the family's grammar wrote it (JSON or bare text)."""
    message, finish = ask(client, alias(FAMILY_TEMPLATES[family]), stream, tools=[TYPED],
                          tool_choice={"type": "function", "function": {"name": "configure"}},
                          seed=5, temperature=1.0, max_tokens=2 * MAX_TOKENS, **THINK)
    assert finish == "tool_calls" and len(message["tool_calls"]) == 1, (message, finish)
    jsonschema.validate(json.loads(message["tool_calls"][0]["arguments"]),
                        TYPED["function"]["parameters"])


@pytest.mark.parametrize("family", [f for f in BARE_VALUES if f != "qwen3-xml"])
def test_a_listed_value_holding_the_close_comes_back_whole(client: OpenAI, family: str) -> None:
    """A strict tool whose only allowed value holds the family's own value close
    ("...</parameter>..."), forced through the SDK: written raw, the parser cut the value
    at it; written as JSON with "<" escaped, it comes back whole. A pattern naming "<"
    cannot be kept apart from the markup: a 400 naming it, not a cut answer."""
    from parsers.families import by_name
    close = by_name(family).shape.close_value("v").rstrip("\n")
    value = f"a{close}b"
    tool = {"type": "function", "function": {"name": "pick", "strict": True, "parameters": {
        "type": "object", "properties": {"v": {"enum": [value]}}, "required": ["v"],
        "additionalProperties": False}}}
    for stream in (False, True):
        message, finish = ask(client, alias(FAMILY_TEMPLATES[family]), stream, tools=[tool],
                              tool_choice={"type": "function", "function": {"name": "pick"}},
                              seed=3, max_tokens=2 * MAX_TOKENS, **THINK)
        assert finish == "tool_calls", (message, finish)
        assert json.loads(message["tool_calls"][0]["arguments"]) == {"v": value}
    named = {"type": "function", "function": {"name": "tag", "strict": True, "parameters": {
        "type": "object", "properties": {"t": {"type": "string", "pattern": "^<[a-z]+>$"}},
        "required": ["t"], "additionalProperties": False}}}
    with pytest.raises(BadRequestError, match="closes a value"):
        ask(client, alias(FAMILY_TEMPLATES[family]), False, tools=[named],
            tool_choice={"type": "function", "function": {"name": "tag"}}, max_tokens=8)


@pytest.mark.parametrize("route", ["responses", "anthropic"])
def test_markup_values_come_back_as_written_on_every_route(server: ServerProcess,
                                                           client: OpenAI, route: str) -> None:
    """The same read-back through the Responses API and the anthropic SDK, each forcing
    the strict tool: each route hands the parser the grammar's record. (Ollama's
    /api/chat has no way to force a tool, and a random model seldom writes the call
    marker by itself; its route passes the record the same way.)"""
    import anthropic

    model = alias(FAMILY_TEMPLATES["qwen3-xml"])
    fn, schema = TYPED["function"], TYPED["function"]["parameters"]
    if route == "responses":
        r = client.responses.create(
            model=model, input="Hi", temperature=1.0, max_output_tokens=2 * MAX_TOKENS,
            tools=[{"type": "function", "name": fn["name"], "parameters": schema,
                    "strict": True}],
            tool_choice={"type": "function", "name": fn["name"]},
            extra_body={"seed": 5, **THINK})
        args = [i.arguments for i in r.output if i.type == "function_call"]
    else:
        sdk = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        m = sdk.messages.create(
            model=model, max_tokens=2 * MAX_TOKENS, messages=[{"role": "user", "content": "Hi"}],
            tools=[{"name": fn["name"], "input_schema": schema, "strict": True}],
            tool_choice={"type": "tool", "name": fn["name"]},
            extra_body={"seed": 5, "temperature": 1.0, **THINK})
        args = [json.dumps(b.input) for b in m.content if b.type == "tool_use"]
    assert len(args) == 1, args
    jsonschema.validate(json.loads(args[0]), schema)


@pytest.mark.parametrize("family", FAMILIES)
def test_json_schema_answers_are_valid(client: OpenAI, family: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER,
                                                  "strict": True}}
    message, finish = ask(client, alias(FAMILY_TEMPLATES[family]), False, seed=4,
                          temperature=1.0, response_format=fmt, max_tokens=MAX_TOKENS,
                          **THINK)
    assert finish == "stop", message
    jsonschema.validate(json.loads(message["content"]), ANSWER)


# custom tools (the Responses API's, Codex's kind) whose input has its own grammar
COMMANDS = r'''
start: cmd (";" cmd)~0..2
cmd: "move"i " " DIR " " STEPS
   | "say " /"[^"\n]{0,6}"/
   | "tab" /\t/ /[\\a-c]{1,3}/
DIR: "north" | "south"
STEPS: /[1-9]\d?/
'''
SUM = r"(add|sub) -?[0-9]{1,3}( [0-9]{1,3}){0,2}"
CUSTOM_TOOLS = [
    {"type": "custom", "name": "robot", "description": "Commands for the robot.",
     "format": {"type": "grammar", "syntax": "lark", "definition": COMMANDS}},
    {"type": "custom", "name": "calc", "description": "A sum.",
     "format": {"type": "grammar", "syntax": "regex", "definition": SUM}}]


@pytest.mark.parametrize("family", FAMILIES)
def test_custom_tool_inputs_follow_their_grammar(client: OpenAI, family: str) -> None:
    """A forced custom tool, through the Responses API: the input, written bare or inside
    a JSON string as the family's markup has it, is a text of the tool's Lark grammar
    (checked by the ``lark`` package) or fully matches its regular expression."""
    import lark

    model = alias(FAMILY_TEMPLATES[family])
    robot = lark.Lark(COMMANDS, start="start", parser="earley", lexer="dynamic")
    # one tool per family, each syntax on both kinds of markup (CI time)
    for name, seed in [("robot", 7), ("calc", 8)][FAMILIES.index(family) % 2:][:1]:
        r = client.responses.create(model=model, input="Hi", tools=CUSTOM_TOOLS,
                                    tool_choice={"type": "custom", "name": name},
                                    temperature=1.0, max_output_tokens=MAX_TOKENS,
                                    extra_body={"seed": seed, **THINK})
        assert r.status == "completed", r.output
        calls = [i for i in r.output if i.type == "custom_tool_call"]
        assert len(calls) == 1 and calls[0].name == name, r.output
        text = calls[0].input
        if name == "robot":
            robot.parse(text)
        else:
            assert re.fullmatch(SUM, text), text


OPENS = [f for f in FAMILIES if f in ("qwen3-xml", "glm", "minimax-m2", "deepseek-r1",
                                      "nemotron-v2", "deepseek-v3.1", "kimi-k3",
                                      "derived:deepseek-v3.2")]


@pytest.mark.parametrize("family", OPENS)
def test_a_thinking_budget_closes_the_family_reasoning(server: ServerProcess, client: OpenAI,
                                                       family: str) -> None:
    """Templates whose prompt opens the reasoning block: the budget spent, the server
    writes the family's end of reasoning and the answer goes on as content."""
    model = alias(FAMILY_TEMPLATES[family])
    message, _ = ask(client, model, False, seed=5, temperature=1.0, max_tokens=60,
                     thinking_budget_tokens=BUDGET,
                     chat_template_kwargs={"enable_thinking": True})
    assert message["reasoning_content"], message
    tokens = httpx.post(f"{server.base_url}/tokenize", json={
        "model": model, "prompt": message["reasoning_content"], "add_special": False},
        timeout=30).json()["tokens"]
    assert len(tokens) <= BUDGET + 2, message  # (+2: a token may split at the edges)
    assert message["content"], message  # the reasoning was closed: what follows is content
    for marker in markup(family):
        assert marker not in message["reasoning_content"] + message["content"], message


def test_every_template_takes_a_tool_conversation_from_the_sdk(client: OpenAI) -> None:
    """A call (``content: null``, arguments as JSON text, an OpenAI id) and its result, sent
    by the OpenAI SDK to a model per template: every one answers (templates that need the
    conversation adapted included: null content, text arguments, Mistral's ids, tool turns
    as text, ``{% generation %}``)."""
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc123def456", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_abc123def456", "content": "Sunny."},
        {"role": "assistant", "content": "Sunny in Rome."},
        {"role": "user", "content": "And tomorrow?"}]
    refused = {}
    for name in TEMPLATES:
        try:
            r = client.chat.completions.create(model=alias(name), messages=messages,
                                               tools=TOOLS, max_tokens=2)
            assert r.choices[0].finish_reason in ("length", "stop", "tool_calls"), name
        except BadRequestError as exc:
            refused[name] = exc.message
    assert not refused


# families whose prompt leaves opening the reasoning to the model, and their opener
SELF_OPENED = {"seed-oss": "<seed:think>", "mistral": "[THINK]",
               "command-r7b": "<|START_THINKING|>", "lfm2": "<think>",
               "granite-3.3": "<think>", "kimi-k2": "<think>", "smollm3": "<think>"}


@pytest.mark.parametrize("family", sorted(SELF_OPENED))
def test_a_thinking_budget_closes_reasoning_the_model_opens(server: ServerProcess,
                                                            client: OpenAI, family: str) -> None:
    """The model opens the block itself (a ``grammar`` makes the random model write the
    family's opener, then anything but markup): once the budget is spent the server writes
    the family's end, and the answer goes on as content."""
    model, opener = alias(FAMILY_TEMPLATES[family]), SELF_OPENED[family]
    end = family_of(FAMILY_TEMPLATES[family])
    from parsers.response_schema import stream_layout

    closer = stream_layout(end.schema).reasoning_end
    grammar = (f"root ::= {_gbnf_literal(opener)} [a-z ]* {_gbnf_literal(chr(10) + closer)} "
               '[ \\n]* [a-z ]+')
    message, finish = ask(client, model, False, seed=6, temperature=1.0, max_tokens=60,
                          thinking_budget_tokens=BUDGET, grammar=grammar)
    assert message["reasoning_content"] and message["content"].strip(), (message, finish)
    tokens = httpx.post(f"{server.base_url}/tokenize", json={
        "model": model, "prompt": message["reasoning_content"], "add_special": False},
        timeout=30).json()["tokens"]
    assert BUDGET - 2 <= len(tokens) <= BUDGET + 2, message  # closed by the budget


def test_apply_template_is_the_chat_routes_prompt_for_every_template(
        server: ServerProcess, client: OpenAI) -> None:
    """llama-server's /apply-template, per template: its text, tokenized without adding
    special tokens (a template that writes its BOS has it in the text), is as long as the
    chat route's prompt, the reasoning opener the server writes for a family included;
    ``enable_thinking: false`` in ``chat_template_kwargs`` reaches the templates that read
    it (Qwen3's writes an empty think block)."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Rome?"}]
    wrong: dict[str, Any] = {}
    prompts: dict[tuple[str, bool], str] = {}
    for name in TEMPLATES:
        model = alias(name)
        for off in (False, True):
            kwargs = {"chat_template_kwargs": {"enable_thinking": False}} if off else {}
            r = httpx.post(f"{server.url}/apply-template", json={
                "model": model, "messages": messages, "tools": TOOLS, **kwargs}, timeout=60)
            assert r.status_code == 200, (name, r.text)
            prompt = prompts[name, off] = r.json()["prompt"]
            count = httpx.post(f"{server.base_url}/tokenize", json={
                "model": model, "prompt": prompt, "add_special": False},
                timeout=60).json()["count"]
            chat = client.chat.completions.create(model=model, messages=messages,
                                                  tools=TOOLS, max_tokens=1,
                                                  extra_body=kwargs)
            assert chat.usage is not None
            if chat.usage.prompt_tokens != count:
                wrong[f"{name} {kwargs}"] = (count, chat.usage.prompt_tokens)
    assert not wrong
    qwen3 = FAMILY_TEMPLATES["hermes"]
    assert prompts[qwen3, True].endswith("<think>\n\n</think>\n\n")
    assert not prompts[qwen3, False].endswith("</think>\n\n")

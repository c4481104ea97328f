"""``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format``: validation,
and the grammar that makes a forced tool call or a JSON answer a guarantee."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from api.web.errors import invalid
from api.web.params import Body
from engine.constraints.grammar import (
    Grammar,
    GrammarError,
    bare_call_grammar,
    bounded,
    harmony_grammar,
    json_grammar,
    tool_call_grammar,
    xml_tool_call_grammar,
)
from engine.constraints.grammar_gemma4 import gemma4_answer_grammar, gemma4_call_grammar
from engine.constraints.grammar_shapes import shaped_call_grammar
from engine.constraints.lark_rules import CUSTOM_GRAMMAR, GrammarSyntaxError, parse_custom
from parsers.response_schema import StreamLayout


@dataclass(frozen=True)
class OutputRules:
    tools: list[dict[str, Any]]  # offered to the template and the parser ([] = none)
    choice: str = "auto"  # "auto", "none", "required", or "function"
    function: str | None = None  # the forced function's name
    parallel: bool = True
    json_schema: dict[str, Any] | None = None  # response_format json_object / json_schema
    json_mode: bool = False
    reasoning_budget: int | None = None  # thinking tokens allowed (None: the config's)
    strict: bool = False  # json_schema's "strict": the schema enforced exactly or refused
    grammar: str | None = None  # llama-server's "grammar": the request's own GBNF
    custom: frozenset[str] = frozenset()  # chat's custom tools (offered as functions)

    @property
    def constrained(self) -> bool:
        """The answer after any reasoning must be a call or a JSON value."""
        return self.json_mode or (bool(self.tools) and self.choice in ("required", "function"))


MAX_GRAMMAR_HINT = 4000  # chars of a custom tool's grammar shown to the model


def custom_parameters(fmt: Any, description: Any, where: str
                      ) -> tuple[dict[str, Any], str | None]:
    """A custom (freeform) tool as a function's parameters, one string ``input``, and its
    description: a ``grammar`` format (``{"syntax", "definition"}``) enforced on the input
    (``engine.constraints.lark_rules``; one it cannot enforce is a 400 naming ``where``)
    and shown to the model in the description."""
    fmt = fmt if isinstance(fmt, dict) else {}
    text: dict[str, Any] = {"type": "string", "description": "The tool's input, as free text"}
    hint = ""
    if fmt.get("type") == "grammar":
        try:
            parse_custom(fmt.get("syntax"), fmt.get("definition"))
        except GrammarSyntaxError as exc:
            raise invalid(where, f"the custom tool's grammar: {exc}") from None
        text[CUSTOM_GRAMMAR] = {"syntax": fmt["syntax"], "definition": fmt["definition"]}
        hint = (f"\nThe input must follow this {fmt['syntax']} grammar:\n"
                + fmt["definition"][:MAX_GRAMMAR_HINT])
    full = f"{description if isinstance(description, str) else ''}{hint}".strip() or None
    return {"type": "object", "properties": {"input": text}, "required": ["input"]}, full


def _custom_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """Chat's ``{"type": "custom", "custom": {"name", "description", "format"}}`` as the
    function the template and the parser see (its format's ``grammar`` object holds the
    syntax and definition the Responses API puts in the format itself)."""
    spec = tool.get("custom")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise invalid(where, "a custom tool is {\"type\": \"custom\", \"custom\": "
                      "{\"name\": ...}}")
    fmt = spec.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        grammar = fmt.get("grammar")
        inner: dict[str, Any] = grammar if isinstance(grammar, dict) else {}
        fmt = {"type": "grammar", "syntax": inner.get("syntax"),
               "definition": inner.get("definition")}
    params, description = custom_parameters(fmt, spec.get("description"),
                                            f"{where}.custom.format")
    fn: dict[str, Any] = {"name": spec["name"], "parameters": params}
    if description is not None:
        fn["description"] = description
    return {"type": "function", "function": fn}


def _check_tools(raw: Any) -> tuple[list[dict[str, Any]], frozenset[str]]:
    """The tools as functions, and the names of those that were chat custom tools."""
    if raw is None:
        return [], frozenset()
    if not isinstance(raw, list):
        raise invalid("tools", "'tools' must be a list")
    tools, custom = [], set()
    for i, tool in enumerate(raw):
        if isinstance(tool, dict) and tool.get("type") == "custom":
            tools.append(_custom_tool(tool, f"tools[{i}]"))
            custom.add(tools[-1]["function"]["name"])
            continue
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or \
                not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"tools[{i}]", "each tool must be {\"type\": \"function\", "
                          "\"function\": {\"name\": ..., \"parameters\": {...}}}")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid(f"tools[{i}].function.parameters", "'parameters' must be an object")
        tools.append(tool)
    return tools, frozenset(custom)


def parse_rules(body: Body) -> OutputRules:
    tools, custom = _check_tools(body.data.get("tools"))
    choice_raw = body.data.get("tool_choice", "auto" if tools else "none")
    function = None
    if choice_raw in ("auto", "none", "required"):
        choice = str(choice_raw)
    elif isinstance(choice_raw, dict) and (
            isinstance(choice_raw.get("function"), dict) or
            (choice_raw.get("type") == "custom" and isinstance(choice_raw.get("custom"), dict))):
        named: dict[str, Any] = choice_raw["function"] \
            if isinstance(choice_raw.get("function"), dict) \
            else choice_raw["custom"]  # a chat custom tool, named the same way
        choice, function = "function", named.get("name")
        if function not in {t["function"]["name"] for t in tools}:
            raise invalid("tool_choice", f"tool_choice names function {function!r}, which is "
                          "not in 'tools'")
    else:
        raise invalid("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if choice in ("required", "function") and not tools:
        raise invalid("tool_choice", f"tool_choice {choice_raw!r} needs 'tools'")
    parallel = body.boolean("parallel_tool_calls", True)
    fmt = body.obj("response_format")
    schema, json_mode, strict = None, False, False
    kind = (fmt or {}).get("type", "text")
    if kind == "json_object":
        json_mode = True
    elif kind == "json_schema":
        spec = (fmt or {}).get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise invalid("response_format", "json_schema needs {\"name\": ..., \"schema\": {...}}")
        schema, json_mode = spec.get("schema") or {"type": "object"}, True
        strict = spec.get("strict") is True
    elif kind != "text":
        raise invalid("response_format", "'response_format.type' must be 'text', "
                      "'json_object' or 'json_schema'")
    if choice == "none":
        tools = []
    return OutputRules(tools, choice, function, parallel, schema, json_mode,
                       reasoning_budget(body), strict, request_grammar(body), custom)


def completion_rules(body: Body) -> OutputRules | None:
    """A raw completion's constraint, as llama-server takes it: ``grammar`` (GBNF) or
    ``json_schema`` (a schema); None when it has neither."""
    grammar, schema = request_grammar(body), body.obj("json_schema")
    if grammar is None and schema is None:
        return None
    return OutputRules([], "none", json_schema=schema, json_mode=schema is not None,
                       grammar=grammar)


def request_grammar(body: Body) -> str | None:
    """llama-server's ``grammar`` field: GBNF text that constrains the whole output in
    place of the server's own grammar (llama.cpp parses it in the grammar checker's child
    process before the engine sees it; here only its size and nesting are bounded)."""
    raw = body.data.get("grammar")
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise invalid("grammar", "'grammar' must be GBNF text")
    try:
        return bounded(raw)
    except GrammarError as exc:
        raise invalid("grammar", str(exc).replace("for this schema ", "")) from None


BUDGET_FIELDS = ("thinking_budget_tokens", "reasoning_budget_tokens")  # llama-server's names


def reasoning_budget(body: Body) -> int | None:
    """The request's thinking budget in tokens (either of llama-server's names)."""
    budget = None
    for name in BUDGET_FIELDS:
        value = body.integer(name, None, 0)
        if value is not None:
            budget = value
    return budget


GRAMMAR_CACHE_SIZE = 64  # built grammars kept (an agent sends the same tools every turn)
_built: OrderedDict[bytes, Grammar | None] = OrderedDict()  # by the rules' digest
_built_lock = threading.Lock()


def build_grammar(rules: OutputRules, layout: StreamLayout, in_reasoning: bool
                  ) -> Grammar | None:
    """The grammar for these rules (None: unconstrained). Runs on the prepare pool; the
    same rules under the same markers give the same grammar, so it is built once (a
    schema that cannot be built raises every time, and is not kept)."""
    text = json.dumps([rules.grammar, rules.tools, rules.choice, rules.function, rules.parallel,
                       rules.json_schema, rules.json_mode, rules.strict, layout.call_start,
                       layout.call_end,
                       _json_calls(layout), layout.reasoning_end if in_reasoning else None,
                       layout.family, layout.name, layout.block_start, layout.block_end,
                       repr(layout.shape)],
                      sort_keys=True)
    key = hashlib.blake2b(text.encode(), digest_size=16).digest()
    with _built_lock:
        if key in _built:
            _built.move_to_end(key)
            return _built[key]
    grammar = _build(rules, layout, in_reasoning)
    with _built_lock:
        _built[key] = grammar
        while len(_built) > GRAMMAR_CACHE_SIZE:
            _built.popitem(last=False)
    return grammar


def _build(rules: OutputRules, layout: StreamLayout, in_reasoning: bool) -> Grammar | None:
    if rules.grammar is not None:
        return Grammar(rules.grammar)
    forced = rules.choice in ("required", "function")
    if layout.family == "harmony":
        return _harmony(rules, layout, in_reasoning)
    if layout.family == "gemma4" and not forced and not rules.json_mode and \
            layout.call_start and layout.call_end and (in_reasoning or rules.tools):
        # a free answer after Gemma 4's thinking, or beside its tools: no stray markup
        return gemma4_answer_grammar(rules.tools, layout.call_start, layout.call_end,
                                     parallel=rules.parallel,
                                     after=layout.reasoning_end if in_reasoning else None)
    if rules.tools and (forced or rules.choice == "auto"):
        tools = [t for t in rules.tools if rules.function in (None, t["function"]["name"])]
        shape = layout.shape
        if shape is not None and (forced or shape.marker):
            # the family's own markup (parsers/families.py); a named function is one call
            return shaped_call_grammar(
                tools, shape, parallel=rules.parallel and rules.choice != "function",
                lazy=not forced, after=layout.reasoning_end if forced and in_reasoning else None)
        if layout.call_start and layout.call_end:
            build = tool_call_grammar if _json_calls(layout) else xml_tool_call_grammar
            if layout.family == "gemma4":
                build = gemma4_call_grammar
            # a forced call follows the reasoning when the prompt opened a reasoning block
            after = layout.reasoning_end if forced and in_reasoning else None
            # a named function is one call (OpenAI: "forces the model to call that function")
            parallel = rules.parallel and rules.choice != "function"
            return build(tools, layout.call_start, layout.call_end, parallel=parallel,
                         lazy=not forced, after=after)
        if forced and not layout.call_start:
            # no call markup in this family: a bare {"name", "arguments"} object, which the
            # response parser reads as a call when tools were offered
            return bare_call_grammar(tools)
    if rules.json_mode:
        after = layout.reasoning_end if in_reasoning else None
        tail, opener, prefix = layout.prompt_tail, layout.content_start, ""
        if tail and opener and opener.startswith(tail):
            prefix = opener[len(tail):]  # the rest of content's opener (Functionary 3.2's)
        return json_grammar(rules.json_schema, after=after, strict=rules.strict,
                            prefix=prefix)
    return None


def _harmony(rules: OutputRules, layout: StreamLayout, in_reasoning: bool) -> Grammar | None:
    """gpt-oss: after the analysis channel, a commentary call or a final answer in harmony's
    own headers (engine.constraints.grammar.harmony_grammar), so a header is never malformed and no
    harmony token reaches the answer; without reasoning, tools or a format, none."""
    tools = [t for t in rules.tools if rules.function in (None, t["function"]["name"])] \
        if rules.choice != "none" else []
    if not tools and not rules.json_mode and not in_reasoning:
        return None
    return harmony_grammar(tools, forced=rules.choice in ("required", "function"),
                           schema=rules.json_schema, json_mode=rules.json_mode,
                           after=layout.reasoning_end if in_reasoning else None,
                           strict=rules.strict)


def _json_calls(layout: StreamLayout) -> bool:
    """Whether a call block holds JSON (Hermes style) rather than XML-like markup."""
    schema = layout.call_schema or {}
    if schema.get("x-parser") == "json":
        return True
    fn = schema.get("properties", {}).get("function", {})
    return isinstance(fn, dict) and fn.get("x-parser") == "json"

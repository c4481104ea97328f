"""Model families read from their chat template: which markup a model writes its reasoning
and tool calls in, with no config.

Each ``Family`` is a Hugging Face response schema (the ``x-regex`` format a config's
``model.response_schema`` uses, so it can be copied into a config and changed there) plus
the ``CallShape`` its forced calls are written in. ``detect(template)`` picks the first
family whose signature the template holds: the literal markup the template itself writes
when it renders an assistant's tool call (or its reasoning), so a fine-tune that keeps its
base model's template keeps its family. A config's ``response_schema`` still wins
(``api/web/app.py``); a template none matches is plain content, said once at start-up.

The families and the parse cases each is checked with are those of llama.cpp's own chat
tests (``tests/test-chat.cpp`` over ``models/templates/``): tests/family_cases.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from parsers.call_shape import CallShape

THINK = ("<think>", "</think>")


@dataclass(frozen=True)
class Family:
    name: str
    models: str  # who writes this markup, for the README and the start-up log
    signature: tuple[str, ...]  # all of these in the template
    schema: dict[str, Any]  # the response schema (Hugging Face x-regex format)
    shape: CallShape | None = None  # how a forced call is written (None: the schema's own
    # plan: Hermes JSON blocks, Qwen XML blocks, harmony, Gemma 4)
    excludes: tuple[str, ...] = ()  # none of these in the template

    def matches(self, template: str) -> bool:
        return all(s in template for s in self.signature) and \
            not any(s in template for s in self.excludes)


def _schema(tool_calls: dict[str, Any], stop: str, think: tuple[str, str] | None = THINK
            ) -> dict[str, Any]:
    """``[reasoning] content tool_calls``: reasoning between ``think``'s markers (the opener
    optional: a template may open it), content up to ``stop`` (a regex: where the calls
    begin)."""
    props: dict[str, Any] = {"role": {"const": "assistant"}}
    content = rf"^\s*(.*?)(?=\s*{stop}|$)"
    if think is not None:
        start, end = map(re.escape, think)
        props["reasoning_content"] = {"type": "string",
                                      "x-regex": rf"^\s*(?:{start})?(.*?)(?={end})"}
        content = rf"^(?:\s*(?:{start})?.*?{end})?\s*(.*?)(?=\s*{stop}|$)"
    props["content"] = {"type": "string", "x-regex": content}
    props["tool_calls"] = tool_calls
    return {"type": "object", "properties": props, "required": ["role"]}


def _reasoning_only(think: tuple[str, str]) -> dict[str, Any]:
    """``[reasoning] content``: a family whose template writes no tool calls."""
    schema = _schema({}, "(?!)", think)
    del schema["properties"]["tool_calls"]
    return schema


def _item(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One call: its name and arguments each read by a regex from the call's text."""
    return {"type": "object", "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "properties": {
            "name": {"type": "string", "x-regex": name}, "arguments": arguments},
            "required": ["name", "arguments"]}},
        "required": ["type", "function"]}


def _json_args(regex: str) -> dict[str, Any]:
    return {"type": "object", "x-regex": regex, "x-parser": "json",
            "additionalProperties": True}


def _kv_args(regex: str, key_value: str) -> dict[str, Any]:
    return {"type": "object", "x-regex": regex, "x-regex-key-value": key_value,
            "additionalProperties": True}


def _json_list(section: str) -> dict[str, Any]:
    """Calls as one JSON array of ``{"name", "arguments"}`` objects (or the family's own key
    names: ``tool_name`` / ``parameters``, ``{NAME: arguments}``) in the ``section`` regex's
    group."""
    return {"type": "array", "x-regex": section, "x-parser": "json",
            "items": {"type": "object"}}


def _json_list_shape(open_: str, close: str, name_key: str = "name",
                     args_key: str = "arguments", head: str = "") -> CallShape:
    return CallShape(call_open=f'{{{head}"{name_key}": "', name_close=f'", "{args_key}": ',
                     call_close="}", section_open=f"{open_}[", section_close=f"]{close}",
                     separator=", ")


_HERMES_ITEM = {"type": "object", "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "x-parser": "json", "properties": {
        "name": {"type": "string"}, "arguments": {"type": "object"}}, "required": ["name"]}},
    "required": ["type", "function"]}

_QWEN_XML_ITEM = _item(r"^<function=([^>\n]+)>\n",
                       _kv_args(r"^<function=[^>\n]+>\n(.*?)\n</function>$",
                                r"<parameter=(?P<key>[^>\n]+)>\n(?P<value>.*?)\n</parameter>"))

# gpt-oss and Gemma 4: the shipped configs' schemas (tests/test_families.py keeps them equal)
_H_CALL = (r"<\|start\|>assistant<\|channel\|>commentary to=functions\.")
_H_JSON = r" <\|constrain\|>json<\|message\|>"
_HARMONY = {"type": "object", "properties": {
    "role": {"const": "assistant"},
    "reasoning_content": {"type": "string", "x-regex": (
        r"^(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>(.*?)"
        r"(?=<\|end\|>|<\|start\|>assistant|$)")},
    "content": {"type": "string", "x-regex": (
        r"^(?:.*?<\|start\|>assistant)?<\|channel\|>final<\|message\|>(.*?)"
        r"(?=<\|return\|>|<\|end\|>|$)")},
    "tool_calls": {"type": "array",
                   "x-regex-iterator": rf"({_H_CALL}\w+{_H_JSON}.*?<\|call\|>)",
                   "items": _item(rf"^{_H_CALL}(\w+){_H_JSON}",
                                  _json_args(rf"^{_H_CALL}\w+{_H_JSON}(.*?)<\|call\|>$"))}},
    "required": ["role"]}
_GEMMA4 = {"type": "object", "properties": {
    "role": {"const": "assistant"},
    "reasoning_content": {"type": "string", "x-regex": (
        r"^(?:<\|turn>model\n)?<\|channel>thought\n(.*?)<channel\|>")},
    "content": {"type": "string", "x-regex": (
        r"^(?:<\|turn>model\n)?(?:(?:<\|channel>thought\n).*?<channel\|>)?(.*?)"
        r"(?=<\|tool_call>|<turn\|>|$)")},
    "tool_calls": {"type": "array", "x-regex-iterator": (
        r"<\|tool_call>(call:[^\{\[]+[\{\[].*?[\}\]])<tool_call\|>"),
        "items": _item(r"^call:(\w+)[\{\[]", {
            "type": "object", "x-regex": r"^call:\w+(\{.*\}|\[.*\])$",
            "x-parser": "gemma4-tool-call", "additionalProperties": True})}},
    "required": ["role"]}

_DS_SECTION = r"<｜tool▁calls▁begin｜>(.*?)(?:<｜tool▁calls▁end｜>|$)"
_DS_CALL = r"<｜tool▁call▁begin｜>(.*?)(?:<｜tool▁call▁end｜>|$)"
_KIMI_ARGS = "<|tool_call_argument_begin|>"
M3_NS = "]<]minimax[>["  # MiniMax M3's namespace token, before each of its tags
_M3 = re.escape(M3_NS)


def _k3(side: str, tag: str) -> str:
    """Kimi K3's tag markup as a regex: <|open|>TAG<|sep|> or <|close|>TAG<|sep|>."""
    return re.escape(f"<|{side}|>{tag}<|sep|>")


_K3_THINK = _k3("open", "think")
_GIGACHAT3_CALL = re.escape("<|message_sep|>\n\nfunction call<|role_sep|>\n")

FAMILIES: tuple[Family, ...] = (
    Family("gpt-oss", "gpt-oss (harmony)", ("<|channel|>", "<|message|>"), _HARMONY),
    Family("gemma4", "Gemma 4", ("<|tool_call>",), _GEMMA4),
    Family("minimax-m3", "MiniMax M3", ("]<]minimax[>[",), _schema(
        {"type": "array", "x-regex": rf"{_M3}<tool_call>(.*?)(?:{_M3}</tool_call>|$)",
         "x-regex-iterator": rf"({_M3}<invoke\b.*?{_M3}</invoke>)",
         "items": _item(rf'^{_M3}<invoke name="([^"]+)"',
                        _kv_args(rf"^{_M3}<invoke[^>]*>(.*){_M3}</invoke>$",
                                 rf"{_M3}<(?P<key>[^<>/\s]+)>(?P<value>.*?)"
                                 rf"{_M3}</(?P=key)>"))},
        rf"{_M3}<tool_call>", ("<mm:think>", "</mm:think>")),
        CallShape(f'{M3_NS}<invoke name="', '">', f"{M3_NS}</invoke>\n",
                  f"{M3_NS}<tool_call>\n", f"{M3_NS}</tool_call>", key_open=f"{M3_NS}<",
                  key_close=">", value_close=f"{M3_NS}</{{key}}>")),
    Family("minimax-m2", "MiniMax M2", ("<minimax:tool_call>",), _schema(
        {"type": "array", "x-regex": r"<minimax:tool_call>(.*?)(?:</minimax:tool_call>|$)",
         "x-regex-iterator": r"(<invoke\b.*?</invoke>)",
         "items": _item(r'^<invoke name="([^"]+)"',
                        _kv_args(r"^<invoke[^>]*>(.*)</invoke>$",
                                 r'<parameter name="(?P<key>[^"]+)">(?P<value>.*?)</parameter>'))},
        r"<minimax:tool_call>"),
        CallShape('<invoke name="', '">\n', "</invoke>\n", "<minimax:tool_call>\n",
                  "</minimax:tool_call>", key_open='<parameter name="', key_close='">',
                  value_close="</parameter>\n")),
    # GigaChat: one call, a JSON object after its own marker (3.1) or role line (3)
    Family("gigachat-3.1", "GigaChat 3.1", ("<|function_call|>",), _schema(
        {"type": "array", "x-regex": r"<\|function_call\|>(.*?)(?:<\|message_sep\|>|$)",
         "x-regex-iterator": r"(\{.*\})", "items": {"type": "object", "x-parser": "json"}},
        r"<\|function_call\|>", None),
        CallShape('{"name": "', '", "arguments": ', "}", "<|function_call|>", single=True)),
    Family("gigachat-3", "GigaChat 3", ("'function call'", "<|role_sep|>"), _schema(
        {"type": "array", "x-regex": _GIGACHAT3_CALL + r"(.*?)(?:<\|message_sep\|>|$)",
         "x-regex-iterator": r"(\{.*\})", "items": {"type": "object", "x-parser": "json"}},
        _GIGACHAT3_CALL, None),
        CallShape('{"name": "', '", "arguments": ', "}",
                  "<|message_sep|>\n\nfunction call<|role_sep|>\n", single=True)),
    Family("kimi-k3", "Kimi K3", ("<|open|>", "<|sep|>", "<|close|>"), {
        "type": "object", "properties": {
            "role": {"const": "assistant"},
            "reasoning_content": {"type": "string", "x-regex": (
                rf"^\s*(?:{_K3_THINK})?(.*?)(?={_k3('close', 'think')})")},
            "content": {"type": "string", "x-regex": (
                rf"^(?:\s*(?:{_K3_THINK})?.*?{_k3('close', 'think')})?\s*"
                rf"(?:{_k3('open', 'response')})?(.*?)(?={_k3('close', 'response')}|"
                rf"{_k3('open', 'tools')}|{_k3('close', 'message')}|$)")},
            "tool_calls": {
                "type": "array",
                "x-regex": rf"{_k3('open', 'tools')}(.*?)(?:{_k3('close', 'tools')}|$)",
                "x-regex-iterator": rf"(<\|open\|>call .*?{_k3('close', 'call')})",
                "items": _item(r'^<\|open\|>call tool="([^"]+)"',
                               _kv_args(r"^<\|open\|>call [^<]*<\|sep\|>(.*)$",
                                        r'<\|open\|>argument key="(?P<key>[^"]+)"[^<]*'
                                        r"<\|sep\|>(?P<value>.*?)<\|close\|>argument"
                                        r"<\|sep\|>"))}},
        "required": ["role"]},
        CallShape('<|open|>call tool="', '" index="{index}"<|sep|>', "<|close|>call<|sep|>",
                  "<|open|>tools<|sep|>", "<|close|>tools<|sep|>",
                  key_open='<|open|>argument key="', key_close='" type="string"<|sep|>',
                  key_close_json='" type="{type}"<|sep|>',
                  value_close="<|close|>argument<|sep|>")),
    Family("kimi-k2", "Kimi K2, K2-Thinking", ("<|tool_calls_section_begin|>",), _schema(
        {"type": "array",
         "x-regex": r"<\|tool_calls_section_begin\|>(.*?)(?:<\|tool_calls_section_end\|>|$)",
         "x-regex-iterator": r"<\|tool_call_begin\|>(.*?)(?:<\|tool_call_end\|>|$)",
         "items": _item(r"^\s*(?:functions\.)?([^:<\s]+)",
                        _json_args(r"<\|tool_call_argument_begin\|>(.*)$"))},
        r"<\|tool_calls_section_begin\|>"),
        CallShape("<|tool_call_begin|>functions.", f":0{_KIMI_ARGS}", "<|tool_call_end|>",
                  "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    Family("deepseek-r1", "DeepSeek R1 and its distills (Llama, Qwen)",
           ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "```json"), _schema(
               {"type": "array", "x-regex": _DS_SECTION, "x-regex-iterator": _DS_CALL,
                "items": _item(r"<｜tool▁sep｜>\s*([^\n]+?)\s*\n",
                               _json_args(r"```(?:json)?\s*(.*?)\s*```"))},
               "<｜tool▁calls▁begin｜>"),
           CallShape("<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n",
                     "\n```<｜tool▁call▁end｜>", "<｜tool▁calls▁begin｜>",
                     "<｜tool▁calls▁end｜>")),
    Family("deepseek-v3.1", "DeepSeek V3.1", ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"),
           _schema({"type": "array", "x-regex": _DS_SECTION, "x-regex-iterator": _DS_CALL,
                    "items": _item(r"^\s*(.+?)\s*<｜tool▁sep｜>",
                                   _json_args(r"<｜tool▁sep｜>(.*)$"))},
                   "<｜tool▁calls▁begin｜>"),
           CallShape("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    Family("mistral", "Mistral Small 3.2, Devstral, Ministral / Magistral",
           ("[TOOL_CALLS]", "[ARGS]"), _schema(
               {"type": "array", "x-regex": r"(\[TOOL_CALLS\].*)$",
                "x-regex-iterator": r"\[TOOL_CALLS\](.*?)(?=\[TOOL_CALLS\]|$)",
                "items": _item(r"^\s*([^\[\s]+)", _json_args(r"\[ARGS\](.*)$"))},
               r"\[TOOL_CALLS\]", ("[THINK]", "[/THINK]")),
           CallShape("[TOOL_CALLS]", "[ARGS]", "")),
    Family("mistral-nemo", "Mistral Nemo", ("[TOOL_CALLS]",),
           _schema(_json_list(r"\[TOOL_CALLS\](.*)$"), r"\[TOOL_CALLS\]", None),
           _json_list_shape("[TOOL_CALLS]", "")),
    Family("command-r7b", "Command R7B, Command A (Cohere2)", ("<|START_ACTION|>",),
           _schema(_json_list(r"<\|START_ACTION\|>(.*?)(?:<\|END_ACTION\|>|$)"),
                   r"<\|START_ACTION\|>", ("<|START_THINKING|>", "<|END_THINKING|>")),
           _json_list_shape("<|START_ACTION|>", "<|END_ACTION|>", "tool_name", "parameters",
                            '"tool_call_id": "0", ')),
    Family("command-r-plus", "Command R+", ("Action:", "tool_name"), _schema(
        {"type": "array", "x-regex": r"Action:\n```json(\s*\[.*?\]\s*)(?:```|$)",
         "x-parser": "json", "items": {"type": "object"}}, "Action:", None),
        _json_list_shape("Action:\n```json\n", "\n```", "tool_name", "parameters")),
    Family("granite-3.3", "Granite 3.3", ("<|tool_call|>",),
           _schema(_json_list(r"<\|tool_call\|>(.*)$"), r"<\|tool_call\|>"),
           _json_list_shape("<|tool_call|>", "")),
    Family("nemotron-v2", "Nemotron Nano v2", ("<TOOLCALL>",),
           _schema(_json_list(r"<TOOLCALL>(.*?)(?:</TOOLCALL>|$)"), "<TOOLCALL>"),
           _json_list_shape("<TOOLCALL>", "</TOOLCALL>")),
    Family("apertus", "Apertus", ("<|tools_prefix|>",),
           _schema(_json_list(r"<\|tools_prefix\|>(.*?)(?:<\|tools_suffix\|>|$)"),
                   r"<\|tools_prefix\|>", ("<|inner_prefix|>", "<|inner_suffix|>")),
           CallShape('{"', '": ', "}", "<|tools_prefix|>[", "]<|tools_suffix|>", ", ")),
    Family("minimax-m1", "MiniMax M1", ("<tool_calls>", "<beginning_of_sentence>"),
           _schema({"type": "array", "x-regex": r"<tool_calls>(.*?)(?:</tool_calls>|$)",
                    "x-regex-iterator": r"(\{[^\n]*\})",
                    "items": {"type": "object", "x-parser": "json"}}, "<tool_calls>"),
           CallShape('{"name": "', '", "arguments": ', "}", "<tool_calls>\n", "\n</tool_calls>",
                     "\n")),
    Family("apriel", "Apriel 1.5 / 1.6", ("<tool_calls>",),
           _schema(_json_list(r"<tool_calls>(.*?)(?:</tool_calls>|$)"), "<tool_calls>", None),
           _json_list_shape("<tool_calls>", "</tool_calls>")),
    Family("firefunction", "FireFunction v2", ("functools[",),
           _schema(_json_list(r"functools(\[.*)$"), "functools", None),
           _json_list_shape(" functools", "")),
    Family("seed-oss", "Seed-OSS", ("<seed:tool_call>",), _schema(
        {"type": "array", "x-regex-iterator": r"<seed:tool_call>\s*(.*?)\s*</seed:tool_call>",
         "items": _item(r"^<function=([^>\n]+)>",
                        _kv_args(r"^<function=[^>\n]+>\n?(.*?)\n?</function>$",
                                 r"<parameter=(?P<key>[^>\n]+)>\n?(?P<value>.*?)\n?"
                                 r"</parameter>"))},
        "<seed:tool_call>", ("<seed:think>", "</seed:think>")),
        CallShape("<seed:tool_call>\n<function=", ">\n", "</function>\n</seed:tool_call>",
                  separator="\n", key_open="<parameter=", key_close=">",
                  value_close="</parameter>\n")),
    Family("glm", "GLM 4.5 / 4.6 / 4.7, and templates that copy its calls", ("<arg_key>",),
           _schema({"type": "array", "x-regex-iterator": r"<tool_call>\s*(.*?)\s*</tool_call>",
                    "items": _item(r"^([^\n<]+?)\s*(?:\n|<arg_key>|$)",
                                   _kv_args(r"^[^\n<]*(.*)$",
                                            r"<arg_key>(?P<key>.*?)</arg_key>\s*"
                                            r"<arg_value>(?P<value>.*?)</arg_value>"))},
                   "<tool_call>"),
           CallShape("<tool_call>", "\n", "</tool_call>", separator="\n",
                     key_open="<arg_key>", key_close="</arg_key>\n<arg_value>",
                     value_close="</arg_value>\n")),
    Family("qwen3-xml", "Qwen3-Coder, Qwen3.5 / 3.6, Nemotron 3 Nano",
           ("<tool_call>", "<function=", "<parameter="),
           _schema({"type": "array", "x-regex-iterator": r"<tool_call>\n(.*?)\n</tool_call>",
                    "items": _QWEN_XML_ITEM}, r"<tool_call>\n")),
    Family("functionary-3.1", "Functionary 3.1 (Llama 3.1)", ("<function=", "python_tag"),
           _schema({"type": "array", "x-regex-iterator": r"<function=([^>]+>.*?)</function>",
                    "items": _item(r"^([^>]+)>", _json_args(r"^[^>]+>(.*)$"))},
                   "<function=", None),
           CallShape("<function=", ">", "</function>")),
    # Functionary 3.2: ">>>RECIPIENT\n" before each message, "all" for content, else a
    # function's name and its JSON arguments; the prompt writes the first ">>>"
    Family("functionary-3.2", "Functionary 3.2 (recipient lines)", (">>>all",), {
        "type": "object", "properties": {
            "role": {"const": "assistant"},
            "content": {"type": "string", "x-regex": r"^(?:>>>all\n)?(.*?)(?=>>>|$)"},
            "tool_calls": {"type": "array", "x-regex": r"(>>>(?!all\n).*)$",
                           "x-regex-iterator": r">>>([^\n]+\n.*?)(?=>>>|$)",
                           "items": _item(r"^([^\n]+)\n", _json_args(r"^[^\n]+\n(.*)$"))}},
        "required": ["role"], "x-prompt-tail": ">>>"},
        CallShape("", "\n", "", separator=">>>")),
    Family("hermes", "Qwen2.5, Qwen3, QwQ, Hermes 2 Pro / 3, Granite 4, MiMo-VL, Bielik, Reka",
           ("<tool_call>",),
           _schema({"type": "array", "x-regex-iterator": r"<tool_call>\s*(.+?)\s*</tool_call>",
                    "items": _HERMES_ITEM}, "<tool_call>"), excludes=("minimax",)),
    *(Family("lfm2", "LFM2, LFM2.5 (Python-style calls)", (signature,), _schema(
        {"type": "array",
         "x-regex": r"<\|tool_call_start\|>(.*?)(?:<\|tool_call_end\|>|$)",
         "x-parser": "python-calls", "items": {"type": "object"}}, r"<\|tool_call_start\|>"),
        CallShape("", "(", ")", "<|tool_call_start|>[", "]<|tool_call_end|>", ", ",
                  key_close="=", value_close=", ", json_values=True))
      # (LFM2.5-Instruct's template writes no calls, only its "List of tools: [")
      for signature in ("<|tool_call_start|>", "<|tool_response_start|>", "List of tools: [")),
    # reasoning only: the template writes no tool calls (tools get no "tools" capability)
    Family("smollm3", "SmolLM3 (reasoning; its template writes no calls)",
           ("Reasoning Mode: ", "/no_think"), _reasoning_only(THINK)),
    # no call markup: an answer that is only a {"name", "parameters"} object is a call
    # (parsers/message_stream.py's bare JSON calls)
    Family("llama3", "Llama 3.1 / 3.2 / 3.3 (JSON calls)", ("<|start_header_id|>", "parameters"),
           _schema({"type": "array", "x-regex-iterator": r"^\s*(\{.*\})\s*$",
                    "items": {"type": "object", "x-parser": "json"}}, "(?!)", None),
           CallShape('{"name": "', '", "parameters": ', "}"), excludes=(">>>",)),
)


def detect(template: str | None) -> Family | None:
    """The family whose markup ``template`` writes (None: none known)."""
    if not template:
        return None
    return next((f for f in FAMILIES if f.matches(template)), None)


def by_name(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(name)

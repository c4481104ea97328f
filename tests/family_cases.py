"""llama.cpp's parse expectations for each model family (``tests/test-chat.cpp`` in the
vendored sources: a template, the text a model writes after its prompt, the tools offered,
and the content, reasoning and calls expected), ported as data: tests/test_families.py
runs them through the parser alone and through the server on tiny models carrying each
template (the text forced by a ``grammar``).

``thinking``: the ``enable_thinking`` the case was written for (None: not set), which
decides whether the template's prompt opens the reasoning block itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llama_templates import template

from parsers.chat_template import ChatTemplate
from parsers.families import M3_NS, Family, detect
from parsers.template_probe import derive

SPECIAL = {"type": "function", "function": {
    "name": "special_function", "description": "I'm special",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}},
                   "required": ["arg1"]}}}
OPTIONAL = {"type": "function", "function": {
    "name": "special_function_with_opt", "description": "I'm special but have optional args",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"},
                                                    "arg2": {"type": "integer"}},
                   "required": ["arg1"]}}}
GET_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
EMPTY = {"type": "function", "function": {
    "name": "empty_args", "description": "A tool that takes no arguments",
    "parameters": {"type": "object", "properties": {}}}}
TOOLS = {t["function"]["name"]: t for t in (SPECIAL, OPTIONAL, GET_TIME, EMPTY)}

HELLO = "Hello, world!\nWhat's up?"  # test-chat.cpp's message_assist
THOUGHT = "I'm\nthinking"  # its message_assist_thoughts
CALL = ("special_function", {"arg1": 1})  # its message_assist_call
JSON_CALL = '{"name": "special_function", "arguments": {"arg1": 1}}'
K3_RESPONSE = "<|open|>response<|sep|>"
PRINT_HEY = "print('hey')"
K3_END = "<|close|>response<|sep|><|close|>message<|sep|>"


def k3_call(name: str, index: int, **args: Any) -> str:
    """One Kimi K3 call as its template writes it (string values bare, others typed)."""
    body = "".join(
        f'<|open|>argument key="{k}" type="{"string" if isinstance(v, str) else "number"}"'
        f"<|sep|>{v}<|close|>argument<|sep|>" for k, v in args.items())
    return f'<|open|>call tool="{name}" index="{index}"<|sep|>{body}<|close|>call<|sep|>'


@dataclass(frozen=True)
class ParseCase:
    template: str  # a file of llama.cpp's models/templates/
    text: str  # what the model writes after the prompt
    content: str = ""
    reasoning: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    thinking: bool | None = None
    tools: tuple[str, ...] = field(default=("special_function",))

    @property
    def id(self) -> str:
        what = "+".join(k for k, v in (("reasoning", self.reasoning), ("content", self.content),
                                       ("calls", self.calls)) if v) or "empty"
        return f"{self.template.removesuffix('.jinja')}:{what}:{len(self.text)}"

    def body_tools(self) -> list[dict[str, Any]]:
        return [TOOLS[name] for name in self.tools]


CASES = [
    # Hermes / Qwen2.5 / Qwen3 / QwQ: <tool_call> JSON </tool_call>, <think>
    ParseCase("Qwen-Qwen2.5-7B-Instruct.jinja", f"<tool_call>\n{JSON_CALL}\n</tool_call>",
              calls=(CALL,)),
    ParseCase("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
              f"{HELLO}<tool_call>\n{JSON_CALL}</tool_call>", content=HELLO, calls=(CALL,)),
    ParseCase("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
              f"<tool_call>\n{JSON_CALL}\n</tool_call>", calls=(CALL,)),
    ParseCase("MiMo-VL.jinja", f"<tool_call>\n{JSON_CALL}\n</tool_call>", calls=(CALL,)),
    ParseCase("Qwen-QwQ-32B.jinja", "Let me think about this...\n</think>\nThe answer is 42.",
              content="The answer is 42.", reasoning="Let me think about this...",
              thinking=True),
    ParseCase("Qwen-Qwen3-0.6B.jinja", f"<think>\n{THOUGHT}\n</think>\n\n{HELLO}",
              content=HELLO, reasoning=THOUGHT),
    ParseCase("ibm-granite-granite-4.0.jinja", f"<tool_call>\n{JSON_CALL}\n</tool_call>",
              calls=(CALL,)),
    # Qwen3-Coder / Qwen3.5 / Nemotron 3: XML calls
    ParseCase("Qwen3-Coder.jinja", "<tool_call>\n<function=special_function>\n"
              "<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>", calls=(CALL,)),
    ParseCase("Qwen3.5-4B.jinja", f"{THOUGHT}\n</think>\n\n{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", f"{THOUGHT}\n</think>\n{HELLO}",
              content=HELLO, reasoning=THOUGHT, thinking=True),
    # Seed-OSS
    ParseCase("ByteDance-Seed-OSS.jinja",
              "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
              content="Hello, world!", reasoning="I'm thinking about the answer"),
    ParseCase("ByteDance-Seed-OSS.jinja", "<seed:tool_call>\n<function=special_function>\n"
              "<parameter=arg1>1</parameter>\n</function>\n</seed:tool_call>", calls=(CALL,)),
    # GLM 4.6 / 4.7
    ParseCase("GLM-4.6.jinja", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n"
              "<arg_value>1</arg_value>\n</tool_call>", calls=(CALL,)),
    ParseCase("GLM-4.7-Flash.jinja", f"{THOUGHT}</think>{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("GLM-4.7-Flash.jinja", "<tool_call>special_function<arg_key>arg1</arg_key>"
              "<arg_value>1</arg_value></tool_call>", calls=(CALL,), thinking=False),
    # MiniMax M2
    ParseCase("MiniMax-M2.jinja", f"{THOUGHT}\n</think>\n\n{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("MiniMax-M2.jinja", "Let's call a tool:\n</think>\n\n<minimax:tool_call>\n"
              '<invoke name="empty_args">\n</invoke>\n</minimax:tool_call>',
              reasoning="Let's call a tool:", calls=(("empty_args", {}),), thinking=True,
              tools=("empty_args",)),
    ParseCase("MiniMax-M2.jinja", '\n</think>\n\n<minimax:tool_call>\n<invoke name='
              '"special_function">\n<parameter name="arg1">1</parameter>\n</invoke>\n'
              "</minimax:tool_call>", calls=(CALL,)),
    # MiniMax M3: a namespace token before every tag, each argument a tag named after it
    ParseCase("MiniMax-M3.jinja", f"</mm:think>{HELLO}", content=HELLO, thinking=True),
    ParseCase("MiniMax-M3.jinja", f"<mm:think>{THOUGHT}</mm:think>{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("MiniMax-M3.jinja", f"<mm:think>Let me check the time</mm:think>{M3_NS}"
              f'<tool_call>\n{M3_NS}<invoke name="get_time">{M3_NS}<city>Tokyo{M3_NS}</city>'
              f"{M3_NS}</invoke>\n{M3_NS}</tool_call>", reasoning="Let me check the time",
              calls=(("get_time", {"city": "Tokyo"}),), thinking=True, tools=("get_time",)),
    ParseCase("MiniMax-M3.jinja", f'</mm:think>{M3_NS}<tool_call>\n{M3_NS}<invoke name='
              f'"special_function">{M3_NS}<arg1>1{M3_NS}</arg1>{M3_NS}</invoke>\n'
              f"{M3_NS}</tool_call>", calls=(CALL,), thinking=True),
    ParseCase("MiniMax-M3.jinja", f"<mm:think>Let's call a tool:</mm:think>{M3_NS}"
              f'<tool_call>\n{M3_NS}<invoke name="empty_args">{M3_NS}</invoke>\n'
              f"{M3_NS}</tool_call>", reasoning="Let's call a tool:",
              calls=(("empty_args", {}),), thinking=True, tools=("empty_args",)),
    ParseCase("MiniMax-M3.jinja", f"<mm:think>Calling both</mm:think>{M3_NS}<tool_call>\n"
              f'{M3_NS}<invoke name="get_time">{M3_NS}<city>Paris{M3_NS}</city>'
              f'{M3_NS}</invoke>\n{M3_NS}<invoke name="special_function">{M3_NS}<arg1>1'
              f"{M3_NS}</arg1>{M3_NS}</invoke>\n{M3_NS}</tool_call>", reasoning="Calling both",
              calls=(("get_time", {"city": "Paris"}), CALL), thinking=True,
              tools=("get_time", "special_function")),
    ParseCase("MiniMax-M3.jinja", f"<mm:think>Thinking about it</mm:think>Let me call the "
              f'function.{M3_NS}<tool_call>\n{M3_NS}<invoke name="special_function">{M3_NS}'
              f"<arg1>1{M3_NS}</arg1>{M3_NS}</invoke>\n{M3_NS}</tool_call>",
              reasoning="Thinking about it", content="Let me call the function.",
              calls=(CALL,), thinking=True),
    # Kimi K3: tags built from <|open|> / <|sep|> / <|close|>, content in a response section,
    # typed arguments; the prompt opens the think section (thinking is on unless set off)
    ParseCase("Kimi-K3.jinja", f"{K3_RESPONSE}{HELLO}{K3_END}", content=HELLO),
    ParseCase("Kimi-K3.jinja", f"I'm thinking about this<|close|>think<|sep|>{K3_RESPONSE}"
              f"{HELLO}{K3_END}", content=HELLO, reasoning="I'm thinking about this"),
    ParseCase("Kimi-K3.jinja", f"{K3_RESPONSE}Use the response tag, then message the handler."
              f"{K3_END}", content="Use the response tag, then message the handler."),
    ParseCase("Kimi-K3.jinja", "I was still thinking when the budget ran out",
              reasoning="I was still thinking when the budget ran out"),
    ParseCase("Kimi-K3.jinja", f"{K3_RESPONSE}<|close|>response<|sep|><|open|>tools<|sep|>"
              f"{k3_call('special_function', 1, arg1=1)}<|close|>tools<|sep|>"
              "<|close|>message<|sep|>", calls=(CALL,)),
    ParseCase("Kimi-K3.jinja", f"I should call it<|close|>think<|sep|>{K3_RESPONSE}On it."
              f"<|close|>response<|sep|><|open|>tools<|sep|>"
              f"{k3_call('special_function', 1, arg1=1)}<|close|>tools<|sep|>"
              "<|close|>message<|sep|>", reasoning="I should call it", content="On it.",
              calls=(CALL,)),
    ParseCase("Kimi-K3.jinja", f"{K3_RESPONSE}<|close|>response<|sep|><|open|>tools<|sep|>"
              f"{k3_call('special_function', 1, arg1=1)}"
              f"{k3_call('special_function_with_opt', 2, arg1=1, arg2=2)}"
              "<|close|>tools<|sep|><|close|>message<|sep|>",
              calls=(CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})),
              tools=("special_function", "special_function_with_opt")),
    ParseCase("Kimi-K3.jinja", f"{K3_RESPONSE}<|close|>response<|sep|><|open|>tools<|sep|>"
              f"{k3_call('get_time', 1, city=PRINT_HEY)}<|close|>tools<|sep|>"
              "<|close|>message<|sep|>", calls=(("get_time", {"city": PRINT_HEY}),),
              tools=("get_time",)),
    # SmolLM3 (no case in llama.cpp's tests): reasoning in <think>, the template writes no
    # calls; thinking off, its prompt closes an empty reasoning block itself
    ParseCase("HuggingFaceTB-SmolLM3-3B.jinja", f"<think>\n{THOUGHT}\n</think>\n{HELLO}",
              content=HELLO, reasoning=THOUGHT, thinking=True, tools=()),
    ParseCase("HuggingFaceTB-SmolLM3-3B.jinja", HELLO, content=HELLO, thinking=False,
              tools=()),
    # Functionary 3.2: recipient lines; the prompt ends with the first ">>>"
    ParseCase("meetkai-functionary-medium-v3.2.jinja", f"all\n{HELLO}", content=HELLO),
    ParseCase("meetkai-functionary-medium-v3.2.jinja", 'special_function\n{"arg1": 1}',
              calls=(CALL,)),
    ParseCase("meetkai-functionary-medium-v3.2.jinja", 'all\nLet me check.>>>get_time\n'
              '{"city": "Paris"}>>>special_function\n{"arg1": 1}', content="Let me check.",
              calls=(("get_time", {"city": "Paris"}), CALL),
              tools=("get_time", "special_function")),
    # GigaChat 3 (a "function call" role line) and 3.1 (its own marker): one JSON call
    ParseCase("GigaChat3-10B-A1.8B.jinja", HELLO, content=HELLO),
    ParseCase("GigaChat3-10B-A1.8B.jinja", f"<|message_sep|>\n\nfunction call<|role_sep|>\n"
              f"{JSON_CALL}", calls=(CALL,)),
    ParseCase("GigaChat3-10B-A1.8B.jinja", f"{HELLO}<|message_sep|>\n\nfunction call"
              f"<|role_sep|>\n{JSON_CALL}", content=HELLO, calls=(CALL,)),
    ParseCase("GigaChat3.1-10B-A1.8B.jinja", HELLO, content=HELLO),
    ParseCase("GigaChat3.1-10B-A1.8B.jinja", f"<|function_call|>{JSON_CALL}", calls=(CALL,)),
    ParseCase("GigaChat3.1-10B-A1.8B.jinja", f"{HELLO}<|function_call|>{JSON_CALL}",
              content=HELLO, calls=(CALL,)),
    # Kimi K2
    ParseCase("moonshotai-Kimi-K2.jinja", "<|tool_calls_section_begin|><|tool_call_begin|>"
              "functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}"
              "<|tool_call_end|><|tool_calls_section_end|>", calls=(CALL,)),
    ParseCase("Kimi-K2-Thinking.jinja", "<think>I'm thinking about this</think>"
              "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
              "<|tool_call_argument_begin|>{\"arg1\": 1}<|tool_call_end|>"
              "<|tool_calls_section_end|>", reasoning="I'm thinking about this",
              calls=(CALL,)),
    ParseCase("Kimi-K2-Thinking.jinja", f"{HELLO}<|tool_calls_section_begin|>"
              "<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>"
              "{\"arg1\": 1}<|tool_call_end|><|tool_calls_section_end|>", content=HELLO,
              calls=(CALL,)),
    # DeepSeek V3.1 and R1 (its distills open the reasoning in the prompt)
    ParseCase("deepseek-ai-DeepSeek-V3.1.jinja", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
              "get_time<｜tool▁sep｜>{\"city\": \"XYZCITY\"}<｜tool▁call▁end｜>"
              "<｜tool▁calls▁end｜>",
              calls=(("get_time", {"city": "XYZCITY"}),), thinking=False, tools=("get_time",)),
    ParseCase("deepseek-ai-DeepSeek-V3.1.jinja", f"{THOUGHT}</think>{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", f"{THOUGHT}</think>{HELLO}",
              content=HELLO, reasoning=THOUGHT, thinking=True),
    ParseCase("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
              "```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", calls=(CALL,),
              thinking=False),
    # Mistral: [TOOL_CALLS]name[ARGS]{...} (Small 3.2, Devstral, Ministral), [THINK]
    ParseCase("Mistral-Small-3.2-24B-Instruct-2506.jinja",
              "[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{\"arg1\": 1}",
              calls=(CALL,)),
    ParseCase("Mistral-Small-3.2-24B-Instruct-2506.jinja",
              "[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{\"arg1\": 1}"
              "[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]"
              "{\"arg1\": 1, \"arg2\": 2}",
              calls=(CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})),
              tools=("special_function", "special_function_with_opt")),
    ParseCase("unsloth-mistral-Devstral-Small-2507.jinja",
              f"{HELLO}[TOOL_CALLS]special_function[ARGS]{{\"arg1\": 1}}", content=HELLO,
              calls=(CALL,)),
    ParseCase("mistralai-Ministral-3-14B-Reasoning-2512.jinja",
              f"[THINK]{THOUGHT}[/THINK]{HELLO}", content=HELLO, reasoning=THOUGHT,
              thinking=True),
    ParseCase("mistralai-Mistral-Nemo-Instruct-2407.jinja",
              '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, '
              '"id": "123456789"}]', calls=(CALL,)),
    ParseCase("mistralai-Mistral-Nemo-Instruct-2407.jinja", HELLO, content=HELLO),
    # Command R7B / Cohere2: <|START_THINKING|>, <|START_ACTION|>[...]
    ParseCase("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
              f"<|START_THINKING|>{THOUGHT}<|END_THINKING|><|START_ACTION|>[\n"
              '    {"tool_call_id": "0", "tool_name": "special_function", '
              '"parameters": {"arg1": 1}}\n]<|END_ACTION|>', reasoning=THOUGHT, calls=(CALL,),
              thinking=True),
    ParseCase("CohereForAI-c4ai-command-r-plus-tool_use.jinja", 'Action:\n```json\n'
              '[{"tool_name": "special_function", "parameters": {"arg1": 1}}]\n```',
              calls=(CALL,)),
    # Granite 3.3, Nemotron Nano v2, Apertus, Apriel, MiniMax M1: JSON lists
    ParseCase("ibm-granite-granite-3.3-2B-Instruct.jinja", f"<think>{THOUGHT}</think>{HELLO}",
              content=HELLO, reasoning=THOUGHT),
    ParseCase("ibm-granite-granite-3.3-2B-Instruct.jinja", f"<|tool_call|>[{JSON_CALL}]",
              calls=(CALL,)),
    ParseCase("NVIDIA-Nemotron-Nano-v2.jinja",
              f"{THOUGHT}\n</think>\n<TOOLCALL>[{JSON_CALL}]</TOOLCALL>", reasoning=THOUGHT,
              calls=(CALL,)),
    ParseCase("Apertus-8B-Instruct.jinja",
              '<|tools_prefix|>[{"special_function": {"arg1": 1}}]<|tools_suffix|>',
              calls=(CALL,)),
    ParseCase("unsloth-Apriel-1.5.jinja", f"<tool_calls>[{JSON_CALL}]</tool_calls>",
              calls=(CALL,)),
    ParseCase("unsloth-Apriel-1.5.jinja", HELLO, content=HELLO),
    ParseCase("MiniMax-M1.jinja", f"<tool_calls>\n{JSON_CALL}\n</tool_calls>", calls=(CALL,)),
    # Functionary 3.1, Llama 3.x
    ParseCase("meetkai-functionary-medium-v3.1.jinja",
              '<function=special_function>{"arg1": 1}</function>', calls=(CALL,)),
    ParseCase("meta-llama-Llama-3.1-8B-Instruct.jinja", HELLO, content=HELLO),
    ParseCase("meta-llama-Llama-3.2-3B-Instruct.jinja",
              '{"name": "special_function", "parameters": {"arg1": 1}}', calls=(CALL,)),
    # Gemma 4 with -m alone (gpt-oss: llamaserve opens the analysis channel in the prompt,
    # so llama.cpp's harmony texts, written after a prompt that does not, do not apply:
    # tests/test_family_plans.py covers it)
    ParseCase("google-gemma-4-31B-it.jinja",
              f"<|channel>thought\n{THOUGHT}<channel|>{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("google-gemma-4-31B-it.jinja",
              '<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>',
              calls=(("get_time", {"city": "London"}),), tools=("get_time",)),
    # LFM2: Python-style calls
    ParseCase("LFM2.5-8B-A1B.jinja", "<think>I'm\nthinking</think><|tool_call_start|>"
              "[special_function(arg1=1)]<|tool_call_end|>", reasoning=THOUGHT, calls=(CALL,)),
    ParseCase("LFM2.5-8B-A1B.jinja", f"<think>I'm\nthinking</think>{HELLO}", content=HELLO,
              reasoning=THOUGHT),
    ParseCase("LFM2-8B-A1B.jinja", "<|tool_call_start|>[special_function(arg1=1), "
              'special_function_with_opt(arg1=1, arg2=2)]<|tool_call_end|>',
              calls=(CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})),
              tools=("special_function", "special_function_with_opt")),
    # LFM2.5-Instruct's template lists the tools but writes no calls: read as LFM2's
    ParseCase("LFM2.5-Instruct.jinja", "<|tool_call_start|>[special_function(arg1=1)]"
              "<|tool_call_end|>", calls=(CALL,)),
    ParseCase("LFM2.5-Instruct.jinja", HELLO, content=HELLO),
    # no built-in family: markup derived from the template (parsers/template_probe.py)
    ParseCase("deepseek-ai-DeepSeek-V3.2.jinja", f"{THOUGHT}</think>{HELLO}", content=HELLO,
              reasoning=THOUGHT, thinking=True),
    ParseCase("deepseek-ai-DeepSeek-V3.2.jinja", "Let me check the time</think>\n\n"
              "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
              '<｜DSML｜parameter name="city" string="true">Tokyo</｜DSML｜parameter>\n'
              "</｜DSML｜invoke>\n</｜DSML｜function_calls>", reasoning="Let me check the time",
              calls=(("get_time", {"city": "Tokyo"}),), thinking=True, tools=("get_time",)),
    ParseCase("deepseek-ai-DeepSeek-V3.2.jinja", "<｜DSML｜function_calls>\n"
              '<｜DSML｜invoke name="special_function">\n<｜DSML｜parameter name="arg1" '
              'string="false">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
              calls=(CALL,), thinking=False),
    ParseCase("deepseek-ai-DeepSeek-V4.jinja", "Let me check the time</think>\n\n"
              "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
              '<｜DSML｜parameter name="city" string="true">Tokyo</｜DSML｜parameter>\n'
              "</｜DSML｜invoke>\n</｜DSML｜tool_calls>", reasoning="Let me check the time",
              calls=(("get_time", {"city": "Tokyo"}),), thinking=True, tools=("get_time",)),
    ParseCase("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "<｜DSML｜tool_calls>\n"
              '<｜DSML｜invoke name="special_function">\n<｜DSML｜parameter name="arg1" '
              'string="false">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
              calls=(CALL,), thinking=False),
    ParseCase("openbmb-MiniCPM5-1B.jinja", '<function name="empty_args"></function>',
              calls=(("empty_args", {}),), thinking=False, tools=("empty_args",)),
    ParseCase("openbmb-MiniCPM5-1B.jinja", "I'm thinking</think><function name="
              '"special_function"><param name="arg1">1</param></function>',
              reasoning="I'm thinking", calls=(CALL,), thinking=True),
]

# the templates no built-in family matches whose markup is derived from the template
# (parsers/template_probe.py), each with the markers found: (reasoning end, calls start)
DERIVED = {
    "deepseek-ai-DeepSeek-V3.2.jinja": ("</think>", "<｜DSML｜function_calls>"),
    "deepseek-ai-DeepSeek-V4.jinja": ("</think>", "<｜DSML｜tool_calls>"),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("</think>", "<｜DSML｜tool_calls>"),
    "openbmb-MiniCPM5-1B.jinja": ("</think>", '<function name="'),
    "tencent-Hy3.jinja": ("</think:opensource>", "<tool_calls:opensource>"),
    "upstage-Solar-Open-100B.jinja": (None, "<|tool_calls|>"),
}

# the family each vendored template is read as (None: no built-in matches; its markup is
# content until a config's response_schema describes it)
DETECTED = {
    "Apertus-8B-Instruct.jinja": "apertus",
    "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel",
    "Bielik-11B-v3.0-Instruct.jinja": "hermes",
    "ByteDance-Seed-OSS.jinja": "seed-oss",
    "Cohere2MoE.jinja": "command-r7b",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "command-r-plus",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command-r7b",
    "GLM-4.6.jinja": "glm",
    "GLM-4.7-Flash.jinja": "glm",
    "GigaChat3-10B-A1.8B.jinja": "gigachat-3",
    "GigaChat3.1-10B-A1.8B.jinja": "gigachat-3.1",
    "HuggingFaceTB-SmolLM3-3B.jinja": "smollm3",
    "Kimi-K2-Instruct.jinja": "kimi-k2",
    "Kimi-K2-Thinking.jinja": "kimi-k2",
    "Kimi-K3.jinja": "kimi-k3",
    "LFM2-8B-A1B.jinja": "lfm2",
    "LFM2.5-8B-A1B.jinja": "lfm2",
    "LFM2.5-Instruct.jinja": "lfm2",
    "MiMo-VL.jinja": "hermes",
    "MiniMax-M1.jinja": "minimax-m1",
    "MiniMax-M2.jinja": "minimax-m2",
    "MiniMax-M3.jinja": "minimax-m3",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3-xml",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron-v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3-xml",
    "Qwen3.5-4B.jinja": "qwen3-xml",
    "Reka-Edge.jinja": "hermes",
    "Spark2.5.jinja": "glm",
    "StepFun3.5-Flash.jinja": "qwen3-xml",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "deepseek-r1",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v3.1",
    "deepseek-ai-DeepSeek-V3.2.jinja": None,
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": None,
    "deepseek-ai-DeepSeek-V4.jinja": None,
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction",
    "google-gemma-2-2b-it.jinja": None,
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite-3.3",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "ibm-granite-granite-4.1.jinja": "hermes",
    "inclusionai-ling-3.0-flash.jinja": "glm",
    "llama-cpp-deepseek-r1.jinja": "deepseek-r1",
    "llama-cpp-rwkv-world.jinja": None,
    "meetkai-functionary-medium-v3.1.jinja": "functionary-3.1",
    "meetkai-functionary-medium-v3.2.jinja": "functionary-3.2",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "microsoft-Phi-3.5-mini-instruct.jinja": None,
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral-nemo",
    "moonshotai-Kimi-K2.jinja": "kimi-k2",
    "muse-glimmer.jinja": None,
    "openai-gpt-oss-120b.jinja": "gpt-oss",
    "openbmb-MiniCPM5-1B.jinja": None,
    "poolside-Laguna-S-2.1.jinja": "glm",
    "poolside-Laguna-XS-2.1.jinja": "glm",
    "poolside-Laguna-XS.2.jinja": "glm",
    "tencent-Hy3.jinja": None,
    "unsloth-Apriel-1.5.jinja": "apriel",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
    "upstage-Solar-Open-100B.jinja": None,
}


def family_of(name: str) -> Family:
    """The built-in family a template is, else the one derived from it (as the server
    picks it)."""
    family = detect(template(name)) or derive(ChatTemplate(template(name), "<s>", "</s>")).family
    assert family is not None, name
    return family


# parameters no single scalar ``type`` describes, as Pydantic and hand-written tools send
# them: call markup writes some as JSON and some as bare text, and each must read back as
# its grammar wrote it, not by the raw schema's ``type`` (a typeless enum came back "2")
TYPED = {"type": "function", "function": {"name": "configure", "strict": True, "parameters": {
    "type": "object", "properties": {
        "level": {"enum": [1, 2, 3]},  # typeless listed values: JSON
        "limit": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                            {"type": "null"}]},  # Pydantic's Optional[int]: JSON
        "unit": {"$ref": "#/$defs/Unit"},  # an IntEnum: JSON
        # a type list: strict writes it as a union of JSON values (the string quoted)
        "code": {"type": ["string", "integer"], "maxLength": 3, "minimum": 100},
        "word": {"allOf": [{"type": "string"}, {"maxLength": 4}]}},  # merged: text
    "required": ["level", "limit", "unit", "code", "word"], "additionalProperties": False,
    "$defs": {"Unit": {"type": "integer", "enum": [10, 20]}}}}}

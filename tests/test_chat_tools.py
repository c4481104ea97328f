"""api/chat/tools.py: a grammar is built once for the same rules (an agent resends its
tools every turn), a different rule or marker builds another, and the cache is bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api.chat import tools as chat_tools
from api.chat.tools import OutputRules, build_grammar
from engine.constraints.grammar import GrammarError
from parsers.response_schema import StreamLayout

CLAUDE_CODE: list[Any] = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
    for t in json.loads((Path(__file__).parent / "fixtures" / "claude_code_tools.json")
                        .read_text())]
HERMES = StreamLayout(call_start="<tool_call>", call_end="</tool_call>",
                      call_schema={"x-parser": "json"})


def test_the_same_rules_give_the_same_grammar_built_once(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    built: list[OutputRules] = []
    real = chat_tools._build
    monkeypatch.setattr(chat_tools, "_build", lambda r, lay, reasoning: built.append(r) or
                        real(r, lay, reasoning))
    first = build_grammar(OutputRules(CLAUDE_CODE, "auto"), HERMES, False)
    again = build_grammar(OutputRules(json.loads(json.dumps(CLAUDE_CODE)), "auto"), HERMES,
                          False)
    assert again is first and len(built) == 1
    forced = build_grammar(OutputRules(CLAUDE_CODE, "required"), HERMES, False)
    other = build_grammar(OutputRules(CLAUDE_CODE[:3], "auto"), HERMES, False)
    xml = build_grammar(OutputRules(CLAUDE_CODE, "auto"),
                        StreamLayout(call_start="<tool_call>", call_end="</tool_call>"), False)
    assert len({id(g) for g in (first, forced, other, xml)}) == 4 and len(built) == 4
    assert first is not None and forced is not None
    assert first.lazy_patterns and not forced.lazy_patterns


def test_the_cache_is_bounded_and_errors_are_not_kept(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    monkeypatch.setattr(chat_tools, "GRAMMAR_CACHE_SIZE", 4)
    for i in range(10):
        build_grammar(OutputRules([], json_schema={"const": i}, json_mode=True), HERMES, False)
    assert len(chat_tools._built) <= 4
    bad = OutputRules([], json_schema={"$ref": "#/nowhere"}, json_mode=True)
    for _ in range(2):
        with pytest.raises(GrammarError):
            build_grammar(bad, HERMES, False)

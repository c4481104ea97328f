"""engine/constraints/gbnf_lark.py: the Lark form llguidance's own conversion writes, for
every grammar that conversion reads, and a working one where it fails."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark as llguidance_gbnf_to_lark

from engine.constraints.gbnf_lark import gbnf_to_lark
from engine.constraints.grammar import GrammarError, json_grammar, tool_call_grammar
from fuzz_schemas import schemas

HANDWRITTEN = [
    'root ::= "a"',
    'root ::= "a" | "b"\n',
    'root ::= x y\nx ::= [a-z]+ "x"\ny ::= ("y" | x)* "\\n"\n',
    '# a comment\nroot ::= item ("," item){0,3} # trailing\nitem ::= [0-9]{1,2} | "-"\n',
    'root ::=\n  "a" |\n  "b" (\n "c"\n | "d" )?\n',
    'root ::= "\\x41\\u00e9\\U0001F600\\"\\\\\\[\\]\\n\\r\\t" [^"\\\\/\\[] .\n',
    'root ::= list\nlist ::= "[" ( value ( "," value )* )? "]"\nvalue ::= list | "0"\n',
    'root ::= camelCase-rule\ncamelCase-rule ::= "x"{2} "y"{2,} "z"{0,1} ("w")?\n',
    'root ::= () | ("")\n',
    'root ::= a\na ::= "1"\na ::= "2"\n',  # a rule defined twice: the last definition
    'root ::= a b\na ::= b\nb ::= "x"\r\n',
]
BROKEN = ['root ::= "a', "root ::= (", "root ::= )", "root ::= *", "x ::= \"a\"",
          'root ::= "\\q"', "root ::= undefined", "root", 'root ::= "a"\n| "b"', ""]


def test_the_same_text_as_llguidances_conversion_on_handwritten_grammars() -> None:
    for text in HANDWRITTEN:
        _same_or_better(text)
        assert _reads(gbnf_to_lark(text)), text
    # llguidance's conversion writes \ue9, \U1F600 and "\[", which llguidance does not read
    assert '"\\x41\\u00e9\U0001F600' in gbnf_to_lark(HANDWRITTEN[5])


@pytest.mark.parametrize("text", BROKEN)
def test_what_it_cannot_read_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        gbnf_to_lark(text)


def _reads(lark: str) -> bool:
    return LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(lark)) == ""


def _same_or_better(text: str) -> None:
    """Where llguidance reads its own conversion's text, ours is the same (chains of
    optional groups kept nested as that writes them) and llguidance reads ours."""
    try:
        theirs: str | None = llguidance_gbnf_to_lark(text)
    except (Exception, RecursionError):  # (theirs fails in many ways)
        theirs = None
    if theirs is None or not _reads(theirs):
        return
    assert gbnf_to_lark(text, compact_after=10**9) == theirs
    assert _reads(gbnf_to_lark(text))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(schemas(), st.booleans())
def test_json_schema_grammars_convert_as_llguidance_does(schema: Any, strict: bool) -> None:
    try:
        grammar = json_grammar(schema, strict=strict)
    except GrammarError:
        return
    _same_or_better(grammar.text)


def test_tool_call_grammars_convert_as_llguidance_does() -> None:
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 40},
                                         "n": {"type": "integer", "minimum": 1}},
        "required": ["q"]}}} for n in ("search", "get-weather", "camelName")]
    for parallel in (False, True):
        for lazy in (False, True):
            _same_or_better(tool_call_grammar(tools, "<tool_call>", "</tool_call>",
                                              parallel=parallel, lazy=lazy).text)


def test_what_llguidance_could_not_read_it_reads() -> None:
    depth = 3000  # llguidance's conversion: a RecursionError (and past ~50, too deep)
    deep = "root ::= " + '("a" ' * depth + ")?" * depth + "\n"
    with pytest.raises(RecursionError):
        llguidance_gbnf_to_lark(deep)
    assert 'start: "a"{0,3000}' in gbnf_to_lark(deep) and _reads(gbnf_to_lark(deep))
    text = json_grammar({"type": "array", "items": {"type": "integer"}, "maxItems": 300}).text
    with pytest.raises(RecursionError):
        llguidance_gbnf_to_lark(text)
    assert 'INTEGER ("," SPACE INTEGER){0,299}' in gbnf_to_lark(text)
    assert _reads(gbnf_to_lark(text))
    text = json_grammar({"type": "string", "maxLength": 60}).text
    assert not _reads(llguidance_gbnf_to_lark(text))  # "too deeply nested"
    assert "CHAR{0,60}" in gbnf_to_lark(text) and _reads(gbnf_to_lark(text))
    clash = 'root ::= fooBar foo-bar\nfooBar ::= x\nfoo-bar ::= x "y"\nx ::= "x" root?\n'
    with pytest.raises(Exception, match="already exists"):
        llguidance_gbnf_to_lark(clash)
    assert _reads(gbnf_to_lark(clash))
    twice = 'root ::= ("a"+)? "b"** "c"*+\n'  # llguidance's: "a"+? (it does not read that)
    assert gbnf_to_lark(twice).endswith('start: ("a"+)? ("b"*)* ("c"*)+\n')
    assert _reads(gbnf_to_lark(twice))

"""Custom tools' grammars (engine/constraints/lark_rules.py and regex_rules.py) as GBNF: every text
llama.cpp's grammar sampler lets through is one the grammar's own reader accepts.

The GBNF is walked with llama.cpp's grammar sampler over SmolLM2's vocabulary
(tests/grammar_walk.py: random logits, what a random-weight model would write), bare and
as the inside of a JSON string; each complete text must parse with the ``lark`` package
(Earley, the reader the Lark syntax is defined by), or fully match with Python's ``re``
for regular expressions. The regular expressions are drawn at random from the constructs
the converter reads, so the property covers their combinations, not a few examples.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator

import lark
import numpy as np
import pytest
from custom_grammars import APPLY_PATCH, lark_oracle
from grammar_walk import GrammarWalker

from conftest import model_path
from engine.constraints.grammar import _converter
from engine.constraints.lark_rules import GrammarSyntaxError, add_rules, parse_custom

GRAMMARS = {
    "apply_patch": APPLY_PATCH,
    # %ignore between a rule's terminals; ? and ! prefixes; imports; left recursion
    "arithmetic": """
?start: sum
?sum: sum ("+" | "-") product | product
!product: product ("*" | "/") atom | atom
?atom: NUMBER | "-" atom | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
""",
    # JSON over Lark's common terminals, whitespace ignored (quotes and escapes inside)
    "json": """
start: value
value: object | array | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: ESCAPED_STRING ":" value
%import common (ESCAPED_STRING, SIGNED_NUMBER, WS)
%ignore WS
""",
    # any case, ranges, ~ counts, aliases, continuation lines, regex flags, a quote
    "commands": r'''
start: cmd (";" cmd)~0..3
cmd: "move"i " " DIR " " STEPS -> move
   | "say " /"[^"\n]{0,6}"/
   | "tab" TAB /[\\a-c]{1,3}/
   | "pick " ("a".."f")~2 /x+/i
DIR.2: "north" | "south"
STEPS: /[1-9]\d?/
TAB: /\t/
''',
}


@pytest.fixture(scope="module")
def walkers() -> Iterator[dict[str, GrammarWalker]]:
    """``text``: closing characters drawn often, so strings, groups and commands end;
    ``lines``: line breaks drawn often (a patch's lines end); ``escaped lines``: the same
    inside a JSON string, where a line break is a backslash and then an ``n``."""
    path = str(model_path("smollm2"))
    out = {"text": GrammarWalker(path, tuple(bytes([c]) for c in b'\n;")]}'), 5.0),
           "lines": GrammarWalker(path, (b"\n",), 6.0),
           "escaped lines": GrammarWalker(path, (b"\\", b"n"), 6.0)}
    w = out["escaped lines"]
    w.bias["short"][[i for i, t in enumerate(w.short) if w.pieces[t] in (b"\\", b"n")]] = 9.0
    yield out
    for w in out.values():
        w.close()


def gbnf(syntax: str, definition: str, json_mode: bool) -> str:
    conv = _converter()
    rule = add_rules(conv, parse_custom(syntax, definition), "t", json_mode)
    conv._add_rule("root", f'"\\"" {rule} "\\""' if json_mode else rule)
    return str(conv.format_grammar())


def texts(walker: GrammarWalker, grammar: str, json_mode: bool, seeds: range,
          steps: int = 300) -> list[str]:
    """The complete walks' texts (a JSON string's decoded value in ``json_mode``)."""
    out = []
    for seed in seeds:
        text = walker.walk(grammar, np.random.default_rng(seed), max_steps=steps)
        if text is None or "\ufffd" in text:
            continue  # cut off; or ended inside a character (llama.cpp's grammar allows it)
        if json_mode:
            value = json.loads(text)
            assert isinstance(value, str), text
            text = value
        out.append(text)
    return out


@pytest.mark.parametrize("json_mode", [False, True], ids=["bare", "json"])
@pytest.mark.parametrize("name", list(GRAMMARS))
def test_walks_of_lark_grammars_parse_with_lark(walkers: dict[str, GrammarWalker],
                                                name: str, json_mode: bool) -> None:
    parser = lark.Lark(lark_oracle(GRAMMARS[name]), start="start", parser="earley",
                       lexer="dynamic")
    seeds, least, kind = range(24), 6, "text"
    if name == "apply_patch":  # long lines: few random walks end (CI time)
        seeds, least, kind = (range(8), 1, "escaped lines") if json_mode else \
            (range(12), 3, "lines")
    done = texts(walkers[kind], gbnf("lark", GRAMMARS[name], json_mode), json_mode, seeds,
                 steps=400)
    assert len(done) >= least, f"only {len(done)} of {len(seeds)} walks completed"
    for text in done:
        parser.parse(text)  # raises on a text outside the grammar


ATOMS = ["a", "b", "Z", "0", "7", " ", '"', "\\\\", "\\n", "\\t", "/", "-", "é", "\\.",
         ".", "\\d", "\\w", "\\s", "\\D", "\\W", "\\S", "[a-c]", "[^a-z]", '[\\d"]',
         "[^\\n\\d]", "[\\\\\\n]", "[^\\W]", "[x-z\\s]", "\\x41", "\\u00e9", "[]a]", "[^]]"]


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A pattern of the constructs the converter reads. A group repeats a bounded number of
    times: unbounded repeats nested in unbounded repeats of overlapping text make llama.cpp's
    grammar keep exponentially many parse stacks (minutes a token), whoever wrote the
    grammar."""
    items = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.2 and depth < 2:
            inner = "|".join(random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3)))
            item = rng.choice(["({})", "(?:{})", f"(?P<g{rng.randint(0, 10**9)}>{{}})"]) \
                .format(inner)
            quant = rng.choice(["", "", "?", "{2}", "{0,2}", "??"])
        else:
            item = rng.choice(ATOMS)
            quant = rng.choice(["", "", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "*?", "{,2}"])
        items.append(item + quant)
    return ("(?i)" if depth == 0 and rng.random() < 0.2 else "") + "".join(items)


@pytest.mark.parametrize("json_mode", [False, True], ids=["bare", "json"])
def test_walks_of_random_regexes_fully_match(walkers: dict[str, GrammarWalker],
                                             json_mode: bool) -> None:
    rng = random.Random(7)
    checked = 0
    for i in range(30):
        pattern = random_regex(rng)
        done = texts(walkers["text"], gbnf("regex", pattern, json_mode), json_mode,
                     range(i, i + 3), steps=60)
        for text in done:
            assert re.fullmatch(pattern, text), (pattern, text)
            checked += 1
    assert checked >= 45


BAD = {
    "no start": ("lark", "begin: \"x\""),
    "undefined": ("lark", "start: thing"),
    "twice": ("lark", "start: \"a\"\nstart: \"b\""),
    "template": ("lark", "start: _sep{x, \",\"}"),
    "declare": ("lark", "%declare X\nstart: \"a\""),
    "other module": ("lark", "%import python.NAME\nstart: NAME"),
    "json extension": ("lark", "start: %json {\"type\": \"object\"}"),
    "count": ("lark", "start: \"a\"~5000"),
    "indirect left recursion": ("lark", "start: a\na: b \"x\" | \"y\"\nb: a \"z\""),
    "left recursion behind an empty start": ("lark", "start: \"q\"? start \"a\" | \"b\""),
    "never ends": ("lark", "start: start \"a\""),
    "range": ("lark", "start: \"ab\"..\"z\""),
    "look-ahead": ("regex", "a(?=b)"),
    "back-reference": ("regex", "(a)\\1"),
    "anchor inside": ("regex", "a^b"),
    "word boundary": ("regex", "\\bword"),
    "possessive": ("regex", "a++"),
    "nothing to repeat": ("regex", "*a"),
    "open class": ("regex", "[abc"),
    "open group": ("regex", "(ab"),
    "unicode class": ("regex", "\\p{L}"),
    "big count": ("regex", "a{2000}"),
    "controls only in JSON": ("regex", "[\\x01-\\x02]"),
    "too long": ("regex", "a" * 70_000),
    "deep": ("regex", "(" * 5000 + "a" + ")" * 5000),
    "unknown syntax": ("ebnf", "start: \"a\""),
}


@pytest.mark.parametrize("name", list(BAD))
def test_what_cannot_be_enforced_is_refused_by_name(name: str) -> None:
    syntax, definition = BAD[name]
    with pytest.raises((GrammarSyntaxError, ValueError)) as err:
        gbnf(syntax, definition, json_mode=True)
    assert str(err.value)

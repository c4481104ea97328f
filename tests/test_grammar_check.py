"""The grammar checker process: llama.cpp parses each new grammar in a child first, so a
grammar that crashes its parser costs one request (a refusal) and not the server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conftest import require_model
from engine.sampling.grammar_check import GrammarChecker, GrammarRefused

pytestmark = pytest.mark.model
GOOD = 'root ::= "yes" | "no"'
# 30,000 nested groups: llama.cpp's parser recurses once per group and runs out of stack
# (engine/constraints/grammar.py refuses this text before any parser; the checker is the
# second wall)
CRASHING = 'root ::= ' + '("a" ' * 30000 + ')?' * 30000


@pytest.fixture(scope="module")
def checker() -> Iterator[GrammarChecker]:
    c = GrammarChecker(require_model("gemma"))
    yield c
    c.close()


def test_accepts_refuses_and_remembers(checker: GrammarChecker) -> None:
    checker.check(GOOD)
    checker.check(GOOD, (r"[\s\S]*?(yes[\s\S]*)",))  # a lazy grammar is parsed as such
    before = checker.stats.cached
    checker.check(GOOD)
    assert checker.stats.cached == before + 1
    with pytest.raises(GrammarRefused, match="could not parse"):
        checker.check('root ::= "unclosed')
    with pytest.raises(GrammarRefused, match="could not parse"):
        checker.check('root ::= "unclosed')  # a refusal is remembered too
    with pytest.raises(GrammarRefused):
        checker.check("root ::= (((")


def test_a_grammar_that_crashes_the_parser_costs_one_refusal(checker: GrammarChecker,
                                                             caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    checker.check(GOOD)
    pid = checker._proc.pid if checker._proc else None
    with pytest.raises(GrammarRefused, match=r"crashed .* \(grammar [0-9a-f]{16}\)"):
        checker.check(CRASHING)
    assert checker.stats.crashed == 1
    assert "llama.cpp crashed (exit code -11) parsing grammar" in caplog.text
    checker.check('root ::= "after"')  # a new child answers the next one
    assert checker._proc is not None and checker._proc.pid != pid
    with pytest.raises(GrammarRefused, match="crashed"):
        checker.check(CRASHING)  # from the cache: the crash is not repeated
    assert checker.stats.crashed == 1


def test_a_checker_that_cannot_start_refuses_with_the_reason(tmp_path: os.PathLike[str]
                                                             ) -> None:
    bad = GrammarChecker(os.path.join(tmp_path, "missing.gguf"))
    try:
        with pytest.raises(GrammarRefused, match="did not start"):
            bad.check(GOOD)
    finally:
        bad.close()

"""One door into the engine: ``api/`` reaches a model only through ``engine.handle``.

Every module under ``api/`` (sub-packages included, ``TYPE_CHECKING`` and function-level
imports included) may import from ``engine`` only these modules:

- ``engine.handle``: ``ModelHandle``, the one per-model object, and the types it hands
  out (``MediaInput``, ``MediaPrompt``, ``FimTokens``, ``EmbedJob`` ...).
- ``engine.config``: the frozen config dataclasses every layer reads.
- ``engine.request``: what crosses the door: ``SamplingParams``, ``Request``, ``Delta``,
  ``TokenLogprob`` and the engine's errors.
- ``engine.media.spans``: ``MediaSpan`` (part of a ``Request``) and ``is_media_token``;
  pure Python.
- ``engine.sampling.reasoning``: ``ReasoningBudget`` (part of ``SamplingParams``: a thinking
  budget and the tokens that close it); pure Python.
- ``engine.constraints.grammar``: the pure grammar builders ``api/chat/tools.py`` turns
  tools and response formats into, and ``GrammarError`` (no llama.cpp state: the
  bindings' pure-Python schema converter only); ``engine.constraints.grammar_gemma4`` and
  ``engine.constraints.grammar_shapes``, the same for Gemma 4's call markup and for the
  other families' (parsers/families.py); ``engine.constraints.lark_rules``, the reader
  of a custom tool's grammar (its 400s, and the schema key that carries it);
  ``engine.constraints.schema_values``, the validator the grammar's schemas are read with,
  which the answer check (``api/chat/answer_check.py``) checks answers with; pure Python.

Anything else (``engine.core``, ``engine.runner``, ``engine.media.projector`` ...) holds
llama.cpp state or the engine thread's internals; reaching it from ``api/`` would tie the
HTTP side to running in the engine's process.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

ALLOWED = frozenset({"engine.handle", "engine.config", "engine.request", "engine.media.spans",
                     "engine.constraints.grammar", "engine.constraints.grammar_gemma4",
                     "engine.constraints.grammar_shapes", "engine.constraints.lark_rules",
                     "engine.sampling.reasoning", "engine.constraints.schema_values"})


def engine_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every engine module the file imports."""
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "engine":  # from engine import runner
                out += [(node.lineno, f"engine.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return sorted((line, m) for line, m in out if m == "engine" or m.startswith("engine."))


def test_api_imports_only_the_engine_door() -> None:
    files = sorted((ROOT / "api").rglob("*.py"))
    assert len(files) > 30
    bad = [f"{path.relative_to(ROOT)}:{line}: {module}"
           for path in files for line, module in engine_imports(path)
           if module not in ALLOWED]
    assert not bad, "api/ imports engine modules outside the door:\n" + "\n".join(bad)


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import engine.runner\nfrom engine import core\n"
                      "def f():\n    from engine.media.projector import Projector\n"
                      "from engine.handle import ModelHandle\nimport enginex\n")
    assert engine_imports(source) == [(1, "engine.runner"), (2, "engine.core"),
                                      (4, "engine.media.projector"), (5, "engine.handle")]

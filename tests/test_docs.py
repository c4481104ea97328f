"""The documentation: the MkDocs site builds with --strict (no broken link or anchor, no page
left out of the nav), every section the README had before its reference pages moved to docs/
still has a heading somewhere (tests/fixtures/readme_sections.txt, captured from the README of
that time), and every relative link in the README reaches a file and heading that exist."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SECTIONS = Path(__file__).resolve().parent / "fixtures" / "readme_sections.txt"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
# [text](target) and ![alt](target), target without spaces, optional "title"
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def headings(path: Path) -> list[str]:
    """ATX headings outside fenced code blocks, as written (inline markup kept)."""
    found, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.append(m.group(2).strip())
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (also the site's: mkdocs.yml uses pymdownx's slugify
    with case=lower, which gives the same)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        base = slug(h)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    text, fenced, lines = path.read_text(encoding="utf-8"), False, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))  # code spans are not links
    return LINK.findall("\n".join(lines))


def test_every_old_readme_section_has_a_heading() -> None:
    wanted = [s for s in SECTIONS.read_text(encoding="utf-8").splitlines() if s.strip()]
    assert len(wanted) >= 40, "the fixture lists the README's sections before the move"
    present: set[str] = set(headings(README))
    for page in DOCS.glob("*.md"):
        present.update(headings(page))
    missing = [s for s in wanted if s not in present]
    assert not missing, f"sections with no heading in README.md or docs/*.md: {missing}"


def test_readme_relative_links_resolve() -> None:
    targets = links(README)
    assert any(t.startswith("docs/") for t in targets)
    own = anchors(README)
    broken = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …
            continue
        file_part, _, anchor = target.partition("#")
        path = (README.parent / unquote(file_part)).resolve() if file_part else README
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in (
                own if path == README else anchors(path)):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_the_two_commands_are_the_same_on_the_landing_pages() -> None:
    start = "pip install -e . && llamaserve pull gemma && llamaserve -C configs/gemma3-270m.json"
    for page in (README, DOCS / "index.md", DOCS / "GETTING_STARTED.md"):
        text = page.read_text(encoding="utf-8")
        assert start in text and "\nbash .ci/run\n" in text, page.name
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            hint = "pip install -e '.[docs]'"
            if os.environ.get("CI"):
                pytest.fail(f"{module} missing: {hint}", pytrace=False)
            pytest.skip(f"{module} not installed: {hint}")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()

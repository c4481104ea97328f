"""api.chat.prepare.system_end: where a system prompt's own text ends in a rendered prompt's
tokens, for templates that fold it into the first user turn (Gemma's) so that no end token
marks it. Real template (Gemma 3's, from configs/gemma3-270m.json) over a stand-in tokenizer
that splits text into words, so token boundaries move as they do in a real vocabulary."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from api.chat.prepare import SYSTEM_END_MIN_CHARS, system_end
from parsers.chat_template import ChatTemplate

ROOT = Path(__file__).resolve().parent.parent
GEMMA = "".join(json.loads((ROOT / "configs" / "gemma3-270m.json").read_text())["model"][
    "chat_template"])
SYSTEM = "You answer questions about the rules below.\n" + " ".join(
    f"Rule {i}: keep the lamp lit." for i in range(40))


class WordTokenizer:
    """Words and the spaces before them are tokens; ``<bos>`` and turn markers are one."""

    bos_token = 1

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def tokenize(self, text: str, add_special: bool = False,
                 parse_special: bool = True) -> list[int]:
        pieces = re.findall(r"<[a-z_]+>|\s*[^\s<]+|\s+", text)
        return [1 if p == "<bos>" else self.ids.setdefault(p, len(self.ids) + 2)
                for p in pieces]


def render(messages: list[dict[str, Any]]) -> tuple[str, list[int], WordTokenizer]:
    text = ChatTemplate(GEMMA, bos_token="<bos>", eos_token="<eos>").render(
        messages, add_generation_prompt=True)
    tok = WordTokenizer()
    return text, tok.tokenize(text), tok


def test_the_end_of_a_system_prompt_inside_the_first_user_turn() -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Rule 3?"}]
    text, tokens, tok = render(messages)
    assert "<start_of_turn>user\n" + SYSTEM in text  # folded into the first user turn
    (n,) = system_end(tok, text, tokens, messages)  # type: ignore[arg-type]
    # a second conversation with the same system prompt shares the first n tokens
    other = [messages[0], {"role": "user", "content": "What about tea?"}]
    text2, tokens2, _ = render(other)
    tokens2 = tok.tokenize(text2)
    assert tokens[:n] == tokens2[:n] and n >= len(tok.tokenize(SYSTEM)) - 1


def test_no_point_without_a_long_system_prompt_or_when_its_text_is_not_there() -> None:
    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert len("Be brief.") < SYSTEM_END_MIN_CHARS
    text, tokens, tok = render(short)
    assert system_end(tok, text, tokens, short) == ()  # type: ignore[arg-type]
    plain = [{"role": "user", "content": SYSTEM}]
    text, tokens, tok = render(plain)
    assert system_end(tok, text, tokens, plain) == ()  # type: ignore[arg-type]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    text, tokens, tok = render(messages)
    # a template that rewrote the text (here: the prompt as given does not contain it)
    assert system_end(tok, text.replace("Rule 1:", "Rule one:"), tokens,  # type: ignore[arg-type]
                      messages) == ()

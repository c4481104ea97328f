"""Incremental detokenization: UTF-8 safety and stop-string hold-back."""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer


def run(pieces: list[bytes], stops: tuple[str, ...] = ()) -> tuple[list[str], str, bool]:
    d = IncrementalDetokenizer(stops)
    out = [d.feed(p) for p in pieces]
    return out, d.flush(), d.stopped


def test_multibyte_character_split_across_tokens_is_emitted_once_complete() -> None:
    euro = "€".encode()  # 3 bytes
    out, tail, _ = run([b"a", euro[:1], euro[1:2], euro[2:], b"b"])
    assert out == ["a", "", "", "€", "b"]
    assert tail == ""


def test_emoji_split_in_every_way() -> None:
    data = "héllo 👋 wörld".encode()
    for cut in range(1, len(data)):
        out, tail, _ = run([data[:cut], data[cut:]])
        assert "".join(out) + tail == "héllo 👋 wörld"
        assert all("\ufffd" not in s for s in out)


def test_stop_string_is_never_emitted_even_across_tokens() -> None:
    out, tail, stopped = run([b"Hello", b" EN", b"D and more"], stops=("END",))
    assert stopped
    assert "".join(out) + tail == "Hello "


def test_partial_stop_is_held_then_released() -> None:
    out, tail, stopped = run([b"abc E", b"Nx"], stops=("END",))
    assert not stopped
    assert out == ["abc ", "ENx"]
    assert tail == ""


def test_held_text_is_flushed_at_the_end() -> None:
    out, tail, stopped = run([b"abc EN"], stops=("END",))
    assert out == ["abc "] and tail == "EN" and not stopped


@pytest.mark.parametrize("stops", [("\n\n",), ("x", "yy", "zzz")])
def test_earliest_stop_wins(stops: tuple[str, ...]) -> None:
    text = "first line\n\nsecond" if stops == ("\n\n",) else "aazzzyyx"
    out, tail, stopped = run([c.encode() for c in text], stops=stops)
    assert stopped
    expected = text[: min(text.find(s) for s in stops if s in text)]
    assert "".join(out) + tail == expected


def test_nothing_after_stop() -> None:
    d = IncrementalDetokenizer(("!",))
    assert d.feed(b"hi!") == "hi"
    assert d.feed(b"more") == ""
    assert d.flush() == ""

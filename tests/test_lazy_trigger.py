"""Where a lazy grammar starts (``engine.sampling.lazy_trigger``): the tokens llama.cpp's
grammar consumed once its trigger fired, for every way a text can be cut into tokens."""

from __future__ import annotations

import itertools
import random

from engine.constraints.grammar import _trigger
from engine.sampling.lazy_trigger import TriggerWatch

MARKER = "<tool_call>"


def run(pieces: list[bytes], built_after: int = 0) -> tuple[int, list[int] | None]:
    """Feed token i = pieces[i]; the vocabulary's pieces are unknown for the first
    ``built_after`` tokens. The step at which the watch answered, and its answer."""
    watch = TriggerWatch.of((_trigger(MARKER),))
    assert watch is not None
    for i in range(len(pieces)):
        fired = watch.feed(i, pieces if i >= built_after else None)
        if fired is not None:
            return i, fired
    return len(pieces), None


def test_the_grammar_starts_at_the_token_that_starts_the_marker() -> None:
    rng = random.Random(7)
    for _ in range(300):
        before = "".join(rng.choice("ab <>_\n") for _ in range(rng.randrange(0, 40)))
        after = "".join(rng.choice('{"x": 1}') for _ in range(rng.randrange(0, 20)))
        text = (before + MARKER + after).encode()
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randrange(0, 12))))
        bounds = [0, *cuts, len(text)]
        pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
        starts = bounds[:-1]
        at = text.index(MARKER.encode())  # the first marker: where llama.cpp's group starts
        ends = [b for b in bounds[1:] if b >= at + len(MARKER)]
        step, fired = run(pieces, built_after=rng.randrange(0, len(pieces) + 1))
        if fired is None:  # the vocabulary was never read: still waiting
            continue
        # it answers on the token that completes the marker (or, read late, when it can)
        assert bounds[step + 1] >= ends[0]
        if at in starts:
            first = starts.index(at)
            assert fired == list(range(first, step + 1))
            assert b"".join(pieces[i] for i in fired).startswith(MARKER.encode())
        else:  # the marker starts inside a token: its first piece would be cut
            assert fired == []


def test_no_marker_keeps_waiting_and_several_patterns_are_not_watched() -> None:
    assert run([b"plain ", b"<tool", b"_cal", b"l"]) == (4, None)
    assert TriggerWatch.of(("(a)", "(b)")) is None
    assert TriggerWatch.of(("(unclosed",)) is None

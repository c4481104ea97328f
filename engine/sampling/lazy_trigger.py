"""Where a lazy grammar starts, seen from outside llama.cpp.

A lazy grammar (a tool call behind its marker under ``tool_choice: auto``, or a call after
the end of reasoning) lets every token through until its trigger pattern appears in the
generated text; llama.cpp then feeds the grammar the text from the pattern's group on and
constrains what follows. llguidance's matcher (``engine.sampling.masks``), which turns the
steps a handful of candidates do not decide from a pass over the whole vocabulary into a
mask, only knows non-lazy grammars. ``TriggerWatch`` follows the same text with the same
pattern: when the group starts where a token starts, the grammar's text is exactly those
tokens, and a matcher that consumed them follows llama.cpp's grammar from there. A group
that starts inside a token (its first piece cut) cannot be given to the matcher: the
request stays on llama.cpp's grammar alone, as before. Either way llama.cpp's grammar
confirms every token the mask lets through, so a watch that saw it wrong costs speed only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# llama.cpp's patterns here are a marker in a group (``engine.constraints.grammar``):
# searching only the text a new token could complete keeps each step constant-time
LOOKBACK = 256  # bytes before the newest piece a marker may have started


@dataclass
class TriggerWatch:
    pattern: re.Pattern[bytes]
    text: bytearray = field(default_factory=bytearray)
    starts: list[int] = field(default_factory=list)  # where each token's piece starts
    tokens: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, patterns: tuple[str, ...]) -> TriggerWatch | None:
        """A watch for one pattern (None: several, or one Python reads otherwise)."""
        if len(patterns) != 1:
            return None
        try:
            return cls(re.compile(patterns[0].encode("utf-8")))
        except re.error:
            return None

    def feed(self, token: int, pieces: list[bytes] | None) -> list[int] | None:
        """Take the next accepted token (``pieces``: each token's text; None while it is
        being built: the tokens are kept and read once it is). When the trigger has
        appeared: the tokens the grammar has consumed (from the group's start, which is a
        token's start), or an empty list when the group starts inside a token. None:
        still waiting."""
        self.tokens.append(token)
        if pieces is None:
            return None
        found = None
        while found is None and len(self.starts) < len(self.tokens):
            before = len(self.text)
            self.starts.append(before)
            self.text += pieces[self.tokens[len(self.starts) - 1]]
            found = self.pattern.search(self.text, max(0, before - LOOKBACK))
        if found is None:
            return None
        start = found.start(1) if self.pattern.groups else found.start()
        for i, at in enumerate(self.starts):
            if at == start:
                return self.tokens[i:]
            if at > start:
                break
        return []

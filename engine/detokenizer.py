"""Incremental, UTF-8-safe detokenization with stop-string hold-back.

Per token the work is bounded by the longest stop string, never by the length of
the sequence: bytes go through an incremental UTF-8 decoder (a character split
across tokens is emitted once complete), and only the tail that could still be
the start of a stop string is held back.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


@dataclass
class IncrementalDetokenizer:
    stops: tuple[str, ...] = ()
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _held: str = ""
    stopped: bool = False
    matched: str | None = None  # the stop string that ended the text

    def __post_init__(self) -> None:
        self._stops = tuple(s for s in self.stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to emit.

        After a stop string is seen, ``stopped`` is set and the text before it is
        the last thing returned; the stop string itself is never returned.
        """
        if self.stopped:
            return ""
        text = self._decoder.decode(piece)
        if not text:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        cut = -1
        for stop in self._stops:
            i = buf.find(stop)
            if i != -1 and (cut == -1 or i < cut):
                cut, self.matched = i, stop
        if cut != -1:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = self._partial_stop_len(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """End of generation: whatever was held back (and any dangling bytes)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop."""
        limit = min(self._hold, len(buf))
        for n in range(limit, 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

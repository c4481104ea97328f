"""An in-memory stand-in for llama.cpp's sequence KV operations (unit tests only).

It records which positions each sequence holds, so tests can check that the
prefix cache keeps llama.cpp's memory and its own bookkeeping in step.
"""

from __future__ import annotations

import json


class FakeKv:
    def __init__(self, n_swa_window: int | None = None, trim_fails: bool = False) -> None:
        self.seqs: dict[int, list[int]] = {}  # seq -> positions held (0..n-1)
        self.window = n_swa_window  # emulate SWA pruning: keep only the last window
        self.trim_fails = trim_fails
        self.ops: list[tuple[object, ...]] = []

    def held(self, seq: int) -> int:
        return len(self.seqs.get(seq, []))

    def decode(self, seq: int, n: int) -> None:
        pos = self.seqs.setdefault(seq, [])
        start = pos[-1] + 1 if pos else 0
        pos.extend(range(start, start + n))
        if self.window is not None:
            top = pos[-1]
            self.seqs[seq] = [p for p in pos if p > top - self.window]

    def seq_trim(self, seq: int, keep: int) -> bool:
        self.ops.append(("trim", seq, keep))
        if self.trim_fails:
            return False
        self.seqs[seq] = [p for p in self.seqs.get(seq, []) if p < keep]
        return True

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        self.ops.append(("copy", src, dst, n))
        self.seqs[dst] = [p for p in self.seqs.get(src, []) if p < n]
        return True

    def seq_clear(self, seq: int) -> None:
        self.seqs[seq] = []

    def seq_pos_min(self, seq: int) -> int:
        pos = self.seqs.get(seq)
        return pos[0] if pos else -1

    def state_get(self, seq: int) -> bytearray:
        return bytearray(json.dumps(self.seqs.get(seq, [])).encode())

    def state_set(self, seq: int, data: bytearray) -> bool:
        try:
            self.seqs[seq] = json.loads(bytes(data))
        except ValueError:
            return False
        return True

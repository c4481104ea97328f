"""An in-memory stand-in for llama.cpp's sequence KV operations (unit tests only).

It records which positions each sequence holds, so tests can check that the
prefix cache keeps llama.cpp's memory and its own bookkeeping in step.

``recurrent=True`` adds what llama.cpp's recurrent memory (hybrid models) does: one state
per sequence that has read the tokens up to ``state[seq]``; a partial trim fails unless it
drops at most ``rollback`` positions (``n_rs_seq`` snapshots, restored by the sequence's
next decode; only a rollback into the last decode finds its snapshot, an older one restores
a stale state just the same); a copy hands the destination the source's state whatever
the range. A decode on a state that is not at the sequence's end puts the sequence in
``wrong``: its output would differ from a fresh evaluation.

``n_swa_window`` adds sliding-window layers as llama.cpp's iSWA cache (``swa_full: false``)
has them: ``seqs`` is what the full-attention layers hold (every position), ``win`` what the
window layers still hold (the last ``window`` positions after each decode); ``seq_pos_min``
reads the window layers, as llama.cpp's does. A decode whose window before its first token
is incomplete puts the sequence in ``wrong``.

Snapshots (``state_get_partial`` / ``seq_rewind``) carry the recurrent state, or the window
layers' positions, alone, as llama.cpp's ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` does: a
rewind to ``n`` restores it and cuts the positions at ``n``, refused (like llama.cpp's
position check) when the snapshot's state is not at ``n``; ``rewind_fails`` makes llama.cpp
refuse every snapshot. Token ids in ``eog`` end a message.
"""

from __future__ import annotations

import json


class FakeKv:
    def __init__(self, n_swa_window: int | None = None, trim_fails: bool = False,
                 recurrent: bool = False, rollback: int = 0, rewind_fails: bool = False,
                 eog: frozenset[int] = frozenset({2})) -> None:
        self.seqs: dict[int, list[int]] = {}  # seq -> positions held (0..n-1)
        self.window = n_swa_window  # emulate SWA pruning: keep only the last window
        self.win: dict[int, list[int]] = {}  # seq -> positions its window layers hold
        self.trim_fails = trim_fails
        self.ops: list[tuple[object, ...]] = []
        self.recurrent = recurrent
        self.rollback = rollback
        self.state: dict[int, int] = {}  # seq -> positions its recurrent state has read
        self.pending: dict[int, int] = {}  # seq -> where its next decode rolls the state back
        self.wrong: set[int] = set()  # seqs that decoded on a state from elsewhere
        self.last: dict[int, int] = {}  # seq -> tokens in its last decode (its snapshots)
        self.rewind_fails = rewind_fails
        self.eog = eog
        self.rewinds: list[tuple[int, int, int | None]] = []  # (seq, n, src) restored

    def is_eog(self, token: int) -> bool:
        return token in self.eog

    def state_get_partial(self, seq: int) -> bytes:
        if self.window is not None and not self.recurrent:
            return json.dumps({"window": self.win.get(seq, []), "wrong": seq in self.wrong,
                               "pad": "x" * 100}).encode()
        assert self.recurrent and seq not in self.pending
        return json.dumps({"state": self.state.get(seq, 0), "wrong": seq in self.wrong,
                           "pad": "x" * 100}).encode()

    def seq_rewind(self, seq: int, n: int, data: bytes, src: int | None = None,
                   last: int | None = None) -> bool:
        self.ops.append(("rewind", seq, n, src))
        if src is not None:
            self.seqs[seq] = [p for p in self.seqs.get(src, []) if p < n]
            self.win[seq] = [p for p in self.win.get(src, []) if p < n]
        if self.rewind_fails:
            return False
        loaded = json.loads(data)
        if "window" in loaded:  # the window layers replaced, then everything cut at n
            self.wrong.discard(seq)
            self.win[seq] = loaded["window"]
            if not loaded["window"] or loaded["window"][-1] != n - 1 or self.held(seq) < n:
                return False  # llama.cpp's seq_pos_max is not n - 1
            if loaded["wrong"]:
                self.wrong.add(seq)
            self.seqs[seq] = [p for p in self.seqs.get(seq, []) if p < n]
            self.rewinds.append((seq, n, src))
            return True
        self.pending.pop(seq, None)
        self.wrong.discard(seq)
        if loaded["state"] != n or self.held(seq) < n:
            return False  # the restored state is not at n (llama.cpp: seq_pos_max)
        self.state[seq] = n
        if loaded["wrong"]:
            self.wrong.add(seq)
        self.seqs[seq] = [p for p in self.seqs.get(seq, []) if p < n]
        self.rewinds.append((seq, n, src))
        return True

    def held(self, seq: int) -> int:
        return len(self.seqs.get(seq, []))

    def decode(self, seq: int, n: int) -> None:
        pos = self.seqs.setdefault(seq, [])
        start = pos[-1] + 1 if pos else 0
        if self.recurrent:
            state = self.pending.pop(seq, self.state.get(seq, 0))
            if state != start:
                self.wrong.add(seq)
            self.state[seq] = start + n
            self.last[seq] = n
        if self.window is not None:
            win = self.win.setdefault(seq, [])
            if not set(range(max(0, start - self.window + 1), start)) <= set(win):
                self.wrong.add(seq)  # attends to a window it does not have
            top = start + n - 1
            self.win[seq] = [p for p in [*win, *range(start, start + n)]
                             if p > top - self.window]
        pos.extend(range(start, start + n))

    def seq_trim(self, seq: int, keep: int) -> bool:
        self.ops.append(("trim", seq, keep))
        if self.trim_fails:
            return False
        if self.recurrent and 0 < keep < self.held(seq):
            if self.held(seq) - keep > self.rollback or seq in self.pending:
                return False
            # a snapshot from within the last decode, else a stale one (-1: never right)
            self.pending[seq] = keep if self.held(seq) - keep < self.last.get(seq, 0) else -1
        elif self.recurrent and keep == 0:
            self.seq_clear(seq)
        self.seqs[seq] = [p for p in self.seqs.get(seq, []) if p < keep]
        self.win[seq] = [p for p in self.win.get(seq, []) if p < keep]
        return True

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        self.ops.append(("copy", src, dst, n))
        self.seqs[dst] = [p for p in self.seqs.get(src, []) if p < n]
        self.win[dst] = [p for p in self.win.get(src, []) if p < n]
        if self.recurrent:  # the source's state as it is, not at n (nor rolled back)
            self.seq_clear(dst)
            self.state[dst] = self.state.get(src, 0)
            if src in self.wrong:
                self.wrong.add(dst)
            self.seqs[dst] = [p for p in self.seqs.get(src, []) if p < n]
        return True

    def seq_clear(self, seq: int) -> None:
        self.seqs[seq] = []
        self.win[seq] = []
        self.state.pop(seq, None)
        self.pending.pop(seq, None)
        self.wrong.discard(seq)

    def seq_pos_min(self, seq: int) -> int:
        pos = self.win.get(seq) if self.window is not None else self.seqs.get(seq)
        return pos[0] if pos else -1

    def state_size(self, seq: int) -> int:
        return len(self.state_get(seq))

    def state_get(self, seq: int) -> bytearray:
        if self.recurrent:
            return bytearray(json.dumps({"pos": self.seqs.get(seq, []),
                                         "state": self.state.get(seq, 0),
                                         "wrong": seq in self.wrong}).encode())
        return bytearray(json.dumps(self.seqs.get(seq, [])).encode())

    def state_set(self, seq: int, data: bytearray) -> bool:
        try:
            loaded = json.loads(bytes(data))
        except ValueError:
            return False
        if not self.recurrent:
            self.seqs[seq] = loaded
            if self.window is not None:  # llama.cpp saves the window layers' last window
                self.win[seq] = [p for p in loaded if p > (loaded[-1] if loaded else 0)
                                 - self.window]
                self.wrong.discard(seq)
            return True
        self.seq_clear(seq)
        self.seqs[seq], self.state[seq] = loaded["pos"], loaded["state"]
        if loaded["wrong"]:
            self.wrong.add(seq)
        return True

"""A small draft model proposing tokens for every generating sequence in one batch.

The draft GGUF gets its own context with the same sequence ids as the target. Each
step it brings every drafting sequence's KV up to the target's history (keeping the
longest common prefix of what it already holds, so rejected proposals and earlier
turns cost nothing extra), then extends all of them greedily, one batched decode
per drafted position, stopping a sequence early when the draft model's own
probability falls under ``draft_model_min_p``. It must share the target's
vocabulary (checked at start-up).
"""

from __future__ import annotations

from dataclasses import replace

from engine.config import ModelConfig
from engine.loading import ModelLoadError
from engine.runner import Runner

PROBE = "Hello world! def add(a, b):\n    return a + b  # ünïcödé 123"


class DraftModel:
    def __init__(self, target: Runner, cfg: ModelConfig, path: str) -> None:
        dcfg = replace(cfg, path=path, threads=cfg.draft_model_threads or cfg.threads,
                       threads_batch=cfg.draft_model_threads_batch or cfg.n_threads_batch,
                       embedding=False, pooling_type=None, swa_full=True, draft_model=None)
        self.runner = Runner(path, dcfg)
        same = (self.runner.n_vocab == target.n_vocab
                and self.runner.vocabulary.tokenize(PROBE) == target.vocabulary.tokenize(PROBE))
        if not same:
            self.runner.close()
            raise ModelLoadError(f"draft model {path} does not share the target model's "
                                 "vocabulary")
        self.min_p = cfg.draft_model_min_p
        self.held: dict[int, list[int]] = {}  # what each draft sequence's KV holds

    def close(self) -> None:
        self.runner.close()

    def lag(self, seq: int, history: int, generated: int) -> int:
        """Generated tokens ``seq`` must catch up on before it can draft (a prompt's
        first catch-up is not counted: every draft of the request needs it)."""
        return max(0, min(history - len(self.held.get(seq, ())), generated))

    def sync(self, work: dict[int, list[int]]) -> int:
        """Make each sequence hold ``work[seq]`` minus its last token (fed next); returns
        how many tokens that took."""
        feeds: dict[int, tuple[list[int], int]] = {}
        for seq, history in work.items():
            held = self.held.setdefault(seq, [])
            target = history[:-1]
            n = _common_prefix(held, target)
            if n < len(held):
                if not self.runner.seq_trim(seq, n):
                    self.runner.seq_clear(seq)
                    n = 0
                del held[n:]
            feeds[seq] = (target[n:], n)
        budget = self.runner.n_batch
        fed = sum(len(tokens) for tokens, _ in feeds.values())
        while any(tokens for tokens, _ in feeds.values()):
            entries = []
            room = budget
            for seq, (tokens, pos) in feeds.items():
                if tokens and room > 0:
                    chunk = tokens[:room]
                    entries.append((seq, chunk, pos))
                    feeds[seq] = (tokens[len(chunk):], pos + len(chunk))
                    self.held[seq].extend(chunk)
                    room -= len(chunk)
            self._decode(entries, keep=set(work))
        return fed

    def _decode(self, entries: list[tuple[int, list[int], int]], keep: set[int]) -> list[int]:
        status, last = self.runner.decode_tokens(entries)
        if status == 1:  # KV full: forget sequences nobody is drafting for, then retry
            for seq in [s for s in self.held if s not in keep]:
                self.runner.seq_clear(seq)
                del self.held[seq]
            status, last = self.runner.decode_tokens(entries)
        if status != 0:
            raise RuntimeError(f"draft model decode returned {status}")
        return last

    def propose(self, work: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        """``work``: seq -> (target history including the pending token, draft length).
        Returns seq -> proposed tokens. Call ``sync`` with the same histories first."""
        drafts: dict[int, list[int]] = {seq: [] for seq in work}
        active = {seq: history[-1] for seq, (history, k) in work.items() if k > 0}
        step = 0
        while active:
            entries = [(seq, [token], len(self.held[seq])) for seq, token in active.items()]
            last = self._decode(entries, keep=set(work))
            step += 1
            following = {}
            for (seq, token), index in zip(active.items(), last, strict=True):
                self.held[seq].append(token)
                nxt, p = self.runner.argmax(index)
                if p < self.min_p:
                    continue
                drafts[seq].append(nxt)
                if step < work[seq][1]:
                    following[seq] = nxt
            active = following
        return drafts


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix; list slices compare in C, so the usual case (the two
    differ only in the last few drafted tokens) costs no Python loop over the history."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    start = max(0, n - 64)
    if a[:start] != b[:start]:
        start = 0
    while start < n and a[start] == b[start]:
        start += 1
    return start

"""MTP drafting's bookkeeping (engine.drafts.mtp.MtpDrafter) against a fake MTP context: which
hidden row each token is paired with, what is carried between batches, what is trimmed.
(The llama.cpp side runs in tests/test_drafting_server.py, on a generated file.)"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.drafts.mtp import NEXTN_SYMBOLS, MtpDrafter, NextnApi, Row

Entry = tuple[int, int, int, Row, bool]


def hidden(pos: int, token: int) -> Row:
    """The fake target's hidden row for ``token`` at ``pos``."""
    return np.array([pos, token], dtype=np.float32)


class FakeMtp:
    n_embd = 2

    def __init__(self) -> None:
        self.target: list[Row] = []
        self.batches: list[list[Entry]] = []
        self.trims: list[tuple[int, int]] = []
        self.cleared: list[int] = []
        self.refuse = 0
        self.held: dict[int, int] = {}  # seq -> positions held
        self.asked_p: list[bool] = []  # top1 asked for the probability

    def decode_target(self, entries: Sequence[tuple[int, Sequence[int], int]]) -> None:
        self.target = [hidden(pos + j, t) for _, tokens, pos in entries
                       for j, t in enumerate(tokens)]

    def target_rows(self, n_tokens: int) -> Row:
        return np.stack(self.target[:n_tokens])

    def process(self, entries: Sequence[Entry]) -> int:
        if self.refuse:
            self.refuse -= 1
            return 1  # no room in the KV
        self.batches.append(list(entries))
        for seq, _, pos, _, _ in entries:
            self.held[seq] = max(self.held.get(seq, 0), pos + 1)
        return 0

    def top1(self, index: int, with_p: bool = True) -> tuple[int, float]:
        _, token, _, _, _ = self.batches[-1][index]
        self.asked_p.append(with_p)
        return token + 1, (0.9 if token < 100 else 0.1)  # "predicts" the next integer

    def row(self, index: int) -> Row:
        _, token, pos, _, _ = self.batches[-1][index]
        return np.array([1000 + pos, token], dtype=np.float32)

    def seq_trim(self, seq: int, keep: int) -> None:
        self.trims.append((seq, keep))
        self.held[seq] = min(self.held.get(seq, 0), keep)

    def seq_clear(self, seq: int) -> None:
        self.cleared.append(seq)
        self.held.pop(seq, None)

    def seq_end(self, seq: int) -> int:
        return self.held.get(seq, 0)


def absorb(d: MtpDrafter, fake: FakeMtp, entries: list[tuple[int, list[int], int]]) -> None:
    fake.decode_target(entries)
    d.absorb(entries)


def pairs(batch: list[Entry]) -> list[tuple[int, int, list[float]]]:
    return [(token, pos, row.tolist()) for _, token, pos, row, _ in batch]


def test_each_token_is_paired_with_the_hidden_row_of_the_token_before_it() -> None:
    fake = FakeMtp()
    d = MtpDrafter(fake)
    absorb(d, fake, [(0, [5, 6, 7], 0), (1, [40, 41], 0)])  # two prompts in one batch
    assert pairs(fake.batches[-1]) == [
        (5, 0, [0, 0]), (6, 1, [0, 5]), (7, 2, [1, 6]),  # a new sequence starts from zeros
        (40, 0, [0, 0]), (41, 1, [0, 40])]
    assert not any(out for *_, out in fake.batches[-1])  # catching up needs no logits
    # next step: seq 0 verifies its pending token 8 with drafts 9, 10; the first token
    # pairs with the row carried over from the previous batch
    absorb(d, fake, [(0, [8, 9, 10], 3)])
    assert pairs(fake.batches[-1]) == [(8, 3, [2, 7]), (9, 4, [3, 8]), (10, 5, [4, 9])]
    assert (0, 3) in fake.trims  # last step's drafted positions leave the MTP context


def test_rows_of_skipped_sequences_keep_their_places() -> None:
    """A prompt with media shares the target's batch (its text items have hidden rows)
    but never drafts: the sequences after it still get their own rows."""
    fake = FakeMtp()
    d = MtpDrafter(fake)
    fake.decode_target([(0, [5, 6], 0), (1, [40, 41], 0)])
    d.absorb([(0, [5, 6], 0), (1, [40, 41], 0)], skip=frozenset({0}))
    assert pairs(fake.batches[-1]) == [(40, 0, [0, 0]), (41, 1, [0, 40])]
    assert d.pending[1].tolist() == [1, 41] and 0 not in d.pending and 0 not in d.known
    fake.decode_target([(0, [7], 2)])
    d.absorb([(0, [7], 2)], skip=frozenset({0}))  # nothing to feed: no empty batch
    assert len(fake.batches) == 1


def test_accept_carries_the_row_of_the_last_accepted_token() -> None:
    fake = FakeMtp()
    d = MtpDrafter(fake)
    absorb(d, fake, [(0, [5, 6, 7], 0)])
    absorb(d, fake, [(0, [8, 9, 10], 3)])
    d.accept(0, accepted=1, keep=5)  # 8 and 9 are in the target's KV, 10 was rejected
    assert d.pending[0].tolist() == [4, 9] and fake.trims[-1] == (0, 5)
    d.accept(0, accepted=7, keep=6)  # more than the batch held: its last row
    assert d.pending[0].tolist() == [5, 10]


def test_propose_chains_the_heads_own_rows_for_all_sequences_in_one_batch() -> None:
    fake = FakeMtp()
    d = MtpDrafter(fake)
    absorb(d, fake, [(0, [5, 6, 7], 0), (1, [40, 41], 0)])
    drafts = d.propose({0: (8, 3, 3), 1: (42, 2, 1), 2: (70, 9, 0)})
    assert drafts == {0: [9, 10, 11], 1: [43], 2: []}
    first, second, third = fake.batches[-3:]
    assert pairs(first) == [(8, 3, [2, 7]), (42, 2, [1, 41])]  # pending token + carried row
    assert all(out for *_, out in first)
    assert pairs(second) == [(9, 4, [1003, 8])]  # then the MTP head's own row
    assert pairs(third) == [(10, 5, [1004, 9])]
    assert fake.asked_p and not any(fake.asked_p)  # no softmax when min_p is 0


def test_min_p_stops_a_draft() -> None:
    fake = FakeMtp()
    d = MtpDrafter(fake, min_p=0.5)
    assert d.propose({0: (99, 3, 4)}) == {0: [100]}  # then p = 0.1 < 0.5: stop
    assert fake.asked_p == [True, True]


def test_a_sequence_with_a_gap_starts_afresh_and_a_full_kv_drops_finished_ones() -> None:
    fake = FakeMtp()
    d = MtpDrafter(fake)
    absorb(d, fake, [(0, [5, 6, 7], 0), (1, [40, 41], 0)])
    # seq 0 now continues at 10: positions 3..9 came from the prefix cache or disk,
    # the MTP context never saw them: clear it and pair the first token with zeros
    absorb(d, fake, [(0, [8, 9], 10)])
    assert fake.cleared == [0] and pairs(fake.batches[-1])[0] == (8, 10, [0, 0])
    fake.refuse = 1  # the MTP KV is full: sequences not in this batch make room
    absorb(d, fake, [(0, [10], 12)])
    assert fake.cleared == [0, 1] and 1 not in d.pending
    assert pairs(fake.batches[-1]) == [(10, 12, [11, 9])]


def test_nextn_symbols_resolve_by_c_or_cpp_name() -> None:
    class Lib:
        pass

    lib = Lib()
    for _, cpp_name in NEXTN_SYMBOLS.values():
        setattr(lib, cpp_name, type("Fn", (), {})())
    assert NextnApi.load(lib) is not None
    delattr(lib, NEXTN_SYMBOLS["get"][1])
    assert NextnApi.load(lib) is None


def test_this_llama_cpp_build_exports_the_nextn_functions() -> None:
    from engine.runner import L

    assert NextnApi.load(L.llama_cpp._lib) is not None

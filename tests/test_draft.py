"""Draft proposals, adaptive length and verification, with no model."""

from __future__ import annotations

import pytest

from engine.draft import DraftControl, DraftState, NgramIndex, PromptLookup, StepCost, verify


def test_ngram_index_proposes_the_continuation_of_the_latest_earlier_occurrence() -> None:
    idx = NgramIndex(max_n=3)
    idx.extend([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 1, 2, 3])
    # trailing 3-gram (1, 2, 3) occurred earlier at the start: propose what followed it
    assert idx.propose(3) == [4, 5, 9]
    idx.extend([4])  # trailing (2, 3, 4): latest earlier occurrence is at 6..8, then 7, 8
    assert idx.propose(2) == [7, 8]
    idx.extend([99])  # never seen: no n-gram matches
    assert idx.propose(4) == []


def test_longest_ngram_wins_over_a_more_recent_shorter_one() -> None:
    idx = NgramIndex(max_n=2)
    idx.extend([5, 6, 1, 9, 6, 2, 5, 6])
    assert idx.propose(1) == [1]  # (5, 6) matched at the start, not the later lone 6


def test_prompt_lookup_indexes_incrementally() -> None:
    lookup = PromptLookup(max_ngram=2)
    state = DraftState()
    prompt, output = [10, 11, 12, 13], [10, 11]
    assert lookup.propose(prompt, output, state, 4) == [12, 13, 10, 11]
    output.append(12)
    assert lookup.propose(prompt, output, state, 2) == [13, 10] and state.synced == 7


def test_verify_keeps_tokens_while_they_match() -> None:
    draft = [5, 6, 7, 8]
    samples = [5, 6, 9, 0, 0]
    out = verify(draft, lambda j: samples[j], lambda j, t: False)
    assert out == [5, 6, 9]  # two accepted, then the model's own token
    everything = verify(draft, lambda j: [5, 6, 7, 8, 4][j], lambda j, t: False)
    assert everything == [5, 6, 7, 8, 4]  # all accepted plus a bonus token
    early = verify(draft, lambda j: samples[j], lambda j, t: j == 0)  # e.g. end of text
    assert early == [5]
    assert verify([], lambda j: 3, lambda j, t: False) == [3]


def test_draft_length_follows_acceptance_and_the_price_of_a_token() -> None:
    c = DraftControl(k_max=16)
    good, bad = DraftState(), DraftState()
    for _ in range(10):
        c.update(good, proposed=8, accepted=8)
        c.update(bad, proposed=4, accepted=0)
    assert good.p_accept > 0.95 and bad.p_accept < 0.2
    cheap, dear = 0.3, 0.9  # memory-bound single stream vs a busy compute-bound batch
    assert c.length(good, cheap) == 16 and c.length(bad, cheap) == 0
    assert 0 < c.length(good, dear) < 16 and c.length(bad, dear) == 0
    fresh = DraftState()  # no evidence yet: short drafts while tokens are cheap
    assert 1 <= c.length(fresh, cheap) <= 3 and c.length(fresh, dear) == 0


def test_a_sequence_priced_out_probes_again_later() -> None:
    c = DraftControl(k_max=16)
    s = DraftState(accepted=0.0, rejected=5.0)
    assert c.length(s, 0.5) == 0
    for _ in range(16):
        c.update(s, proposed=0, accepted=0)  # steps without a draft
    assert c.length(s, 0.5) == 1  # a one-token probe
    c.update(s, proposed=1, accepted=0)
    assert c.length(s, 0.5) == 0 and s.explore_after == 32  # missed: wait longer
    for _ in range(32):
        c.update(s, proposed=0, accepted=0)
    assert c.length(s, 0.5) == 1
    for _ in range(6):  # probes that hit restore the estimate
        c.update(s, proposed=1, accepted=1)
    assert s.explore_after == 16 and c.length(s, 0.5) >= 1


def test_step_cost_fit_and_ratio() -> None:
    cost = StepCost()
    c = DraftControl(k_max=8)
    assert c.ratio(cost, 1) == c.default_ratio  # nothing measured yet
    for tokens in (1, 1, 17, 1, 512, 8, 1, 17):
        cost.observe(tokens, 0.012 + 0.006 * tokens)
    fixed, per_token = cost.fit() or (0, 0)
    assert abs(fixed - 0.012) < 1e-6 and abs(per_token - 0.006) < 1e-6
    single, busy = c.ratio(cost, 1), c.ratio(cost, 8)
    assert single == pytest.approx(0.006 / 0.018) and busy == pytest.approx(0.048 / 0.060)
    assert c.ratio(cost, 1, draft_cost=0.006) == pytest.approx(0.012 / 0.018)

"""Draft proposals, their sizing and verification, with no model."""

from __future__ import annotations

import pytest

from engine.drafts.ngram_index import NgramIndex, Proposal
from engine.drafts.policy import (
    ALIGN,
    Acceptance,
    DraftLimit,
    DraftState,
    PromptLookup,
    StepCost,
    accepted_count,
    allocate,
    default_cost,
    verify,
)


def test_ngram_index_proposes_the_continuation_of_the_latest_earlier_occurrence() -> None:
    idx = NgramIndex(max_n=3)
    idx.extend([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 1, 2, 3])
    # trailing 3-gram (1, 2, 3) occurred earlier at the start: propose what followed it
    p = idx.propose(3)
    assert p.tokens == [4, 5, 9] and p.kind == "ngram3" and p.src == 3
    idx.extend([4])  # trailing (2, 3, 4): latest earlier occurrence is at 6..8, then 7, 8
    assert idx.propose(2).tokens == [7, 8]
    idx.extend([99])  # never seen: no n-gram matches
    assert idx.propose(4).tokens == []


def test_longest_ngram_wins_over_a_more_recent_shorter_one() -> None:
    idx = NgramIndex(max_n=2)
    idx.extend([5, 6, 1, 9, 6, 2, 5, 6])
    p = idx.propose(1)
    assert p.tokens == [1] and p.kind == "ngram2"  # (5, 6) at the start, not the lone 6


SOURCE = [10, 11, 12, 13, 50, 14, 15, 16, 17, 18, 50, 19, 20, 21, 50, 22, 23]  # 50: a name


def copy_step(idx: NgramIndex, truth: list[int], done: int, k: int) -> tuple[Proposal, int]:
    """Propose, verify against ``truth`` (what the model says) and follow; returns the
    proposal and how many tokens were emitted."""
    p = idx.propose(k)
    accepted = 0
    while (accepted < len(p.tokens) and done + accepted < len(truth) - 1
           and p.tokens[accepted] == truth[done + accepted]):
        accepted += 1
    emitted = truth[done:done + accepted + 1]
    idx.follow(p, len(p.tokens), accepted, emitted)
    idx.extend(emitted)
    return p, len(emitted)


def test_copy_cursor_follows_an_edit_and_learns_the_rename() -> None:
    """The model re-emits SOURCE with the name 50 renamed to 60: the first occurrence
    costs one rejected draft; the copy goes on right after it, and the second
    occurrence is proposed renamed."""
    truth = [60 if t == 50 else t for t in SOURCE] + [2]  # 2: the end
    idx = NgramIndex(max_n=3)
    idx.extend([*SOURCE, 1, 10, 11])  # the prompt, a separator, the answer's first tokens
    done = 2
    p, n = copy_step(idx, truth, done, 8)  # (10, 11) -> 12, 13, 50: rejected at 50
    assert p.kind == "ngram2" and n == 3 and idx.missed
    done += n
    p, n = copy_step(idx, truth, done, 5)  # the model said 60 for 50: skip 50 and go on
    assert p.kind == "substitute" and p.tokens == [14, 15, 16, 17, 18] and n == 6
    assert idx.replacements.table == {(50,): (60,)}  # confirmed: the copy went on after it
    done += n
    p, n = copy_step(idx, truth, done, 16)  # the rest: the third 50 is proposed as 60
    assert p.kind == "cursor" and p.tokens[:6] == [19, 20, 21, 60, 22, 23]
    assert done + n == len(truth)


def test_a_wrong_replacement_is_forgotten_when_the_model_keeps_the_original() -> None:
    idx = NgramIndex(max_n=2)
    idx.replacements.add((50,), (60,))
    idx.extend([*SOURCE, 1, 10, 11])
    truth = [*SOURCE, 2]  # no rename after all
    p, _ = copy_step(idx, truth, 2, 8)
    assert p.tokens[2] == 60 and idx.missed and not idx.replacements


def test_the_cursor_is_dropped_after_repeated_misses() -> None:
    idx = NgramIndex(max_n=2)
    idx.extend([*SOURCE, 1, 10, 11])
    truth = [10, 11, 12, 13, 50, 99, 98, 97, 96, 95, 94, 93, 92, 2]
    done = 2
    for _ in range(6):
        _, n = copy_step(idx, truth, done, 4)
        done += n
    assert idx.cursor == -1  # strayed from the source: back to plain n-gram lookup


def test_prompt_lookup_indexes_incrementally() -> None:
    lookup = PromptLookup(max_ngram=2)
    state = DraftState()
    prompt, output = [10, 11, 12, 13], [10, 11]
    assert lookup.propose(prompt, output, state, 4).tokens == [12, 13, 10, 11]
    output.append(12)
    assert lookup.propose(prompt, output, state, 2).tokens == [13, 10] and state.synced == 7


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


def test_acceptance_learns_per_kind_and_fades_back_when_idle() -> None:
    a = Acceptance()
    fresh = a.chances("cursor", 4)
    assert fresh == sorted(fresh, reverse=True) and 0 < fresh[-1] < fresh[0] <= 1
    for _ in range(10):
        a.observe("cursor", proposed=16, accepted=16)
        a.observe("ngram1", proposed=8, accepted=0)
    good, bad = a.chances("cursor", 16), a.chances("ngram1", 16)
    assert good[0] > 0.9 and good[15] > 0.75 and bad[0] < 0.2
    a.rest(400)  # a long time without drafting: back near the prior, so it tries again
    assert a.chances("ngram1", 1)[0] > 0.3


def test_step_cost_table_interpolation_and_fit() -> None:
    cost = StepCost()
    assert not cost.ready
    truth = {1: 0.025, 8: 0.110, 16: 0.170, 17: 0.210, 64: 0.450}
    for _ in range(3):
        for n, s in truth.items():
            cost.observe(n, s)
    assert cost.ready
    for n, s in truth.items():
        assert cost(n) == pytest.approx(s)
    assert cost(40) == pytest.approx(0.21 + (0.45 - 0.21) * 23 / 47)  # between 17 and 64
    # past the top: the slope from the largest size at most half as big (17 -> 64)
    assert cost(128) == pytest.approx(0.45 + (0.45 - 0.21) / 47 * 64)


def test_step_cost_past_the_top_follows_the_large_sizes_not_the_one_token_steps() -> None:
    cost = StepCost()  # measured on the 2-core CPU: a second token costs more than a step
    truth = {1: 0.035, 2: 0.073, 4: 0.085, 8: 0.145, 16: 0.230}
    for _ in range(30):
        cost.observe(1, 0.035)
    for _ in range(2):
        for n, s in truth.items():
            cost.observe(n, s)
    assert cost(32) == pytest.approx(0.230 + (0.230 - 0.145) / 8 * 16)  # measured: 0.391


def test_allocate_drafts_long_when_tokens_are_cheap_and_not_at_all_when_not() -> None:
    sure = [0.999 ** i for i in range(64)]
    # memory-bound: a 64-token step costs 4 single ones (the GPU / big-model case)
    assert allocate([sure], 1, 511, lambda n: 1 + 3 * (n - 1) / 63) == [63]
    # compute-bound: every extra token costs as much as a step
    assert allocate([sure], 1, 511, lambda n: float(n)) == [0]
    hopeless = [0.05 * 0.5 ** i for i in range(64)]
    assert allocate([hopeless], 1, 511, default_cost) == [0]
    assert allocate([sure], 1, 10, lambda n: 1 + 3 * (n - 1) / 63) == [7]  # limit, aligned


def test_allocate_gives_the_batch_room_to_the_likeliest_drafts() -> None:
    good, poor = [0.95 ** i for i in range(32)], [0.3 * 0.5 ** i for i in range(32)]
    lengths = allocate([good, poor, good], 3, 500, lambda n: 1 + 0.05 * n)
    assert lengths[1] == 0 and lengths[0] > 8 and lengths[2] > 8
    assert (3 + sum(lengths)) % ALIGN == 0  # big steps stay tile-aligned


def test_allocate_charges_a_catch_up_once_per_sequence() -> None:
    sure = [0.9 ** i for i in range(6)]
    cheap = lambda n: 1 + 0.1 * (n - 1)  # noqa: E731
    assert allocate([sure], 1, 100, cheap, setup=[0.0]) == [6]
    assert allocate([sure], 1, 100, cheap, setup=[50.0]) == [0]  # too far behind to pay
    lengths = allocate([sure, sure], 2, 100, cheap, setup=[0.0, 50.0])
    assert lengths[0] == 6 and lengths[1] == 0


def test_accepted_count_when_the_request_stops_on_a_drafted_token() -> None:
    assert accepted_count([5, 6, 7], [5, 6, 9]) == 2  # rejected at 7: the model said 9
    assert accepted_count([5, 6, 7], [5, 6]) == 2  # stopped on 6 (end of text): no miss
    assert accepted_count([5, 6, 7], [5, 6, 7, 8]) == 3 and accepted_count([], [4]) == 0


def test_step_cost_below_the_smallest_measured_size_stays_positive_and_monotone() -> None:
    cost = StepCost()
    for n, s in ((8, 0.06), (8, 0.06), (16, 0.17), (16, 0.17), (1, 0.05)):
        cost.observe(n, s)
    small = [cost(n) for n in range(1, 9)]
    assert all(c > 0.005 for c in small) and small == sorted(small)


def test_a_replacement_seen_before_a_step_without_drafts_is_still_learned() -> None:
    truth = [60 if t == 50 else t for t in SOURCE] + [2]
    idx = NgramIndex(max_n=3)
    idx.extend([*SOURCE, 1, 10, 11])
    _, n = copy_step(idx, truth, 2, 8)  # rejected at 50: the model said 60
    done = 2 + n
    p = idx.propose(8)  # priced out this step: no draft, the model emits one token
    idx.follow(p, 0, 0, truth[done:done + 1])
    idx.extend(truth[done:done + 1])
    done += 1
    p, n = copy_step(idx, truth, done, 4)  # back in step with the source
    assert n == 5 and idx.replacements.table == {(50,): (60,)}


def test_a_request_stopping_on_a_drafted_token_is_not_a_miss() -> None:
    idx = NgramIndex(max_n=2)
    idx.extend([*SOURCE, 1, 10, 11])
    p = idx.propose(6)  # 12, 13, 50, 14, ...
    idx.follow(p, 6, 2, [12, 13])  # end of text right after 13
    assert not idx.missed and idx.miss is None and idx.aligned and idx.cursor == 4


def test_draft_limit_grows_past_the_configured_maximum_while_whole_drafts_are_accepted() -> None:
    limit = DraftLimit(base=8, top=64)
    limit.observe(7, 7, 8)  # a whole draft near the limit (7 + 1 tokens: aligned): double
    assert limit.limit == 16
    limit.observe(8, 8, 9)  # a whole draft of half the limit (sized down): no evidence
    assert limit.limit == 16
    for _ in range(5):
        limit.observe(limit.limit, limit.limit, limit.limit + 1)
    assert limit.limit == 64  # capped
    limit.observe(64, 30, 31)  # rejected far in: half
    assert limit.limit == 32
    limit.observe(30, 6, 7)  # rejected early: twice what was right
    assert limit.limit == 12
    for _ in range(5):
        limit.observe(limit.limit, 0, 1)
    assert limit.limit == 8  # never below the configured maximum (the default floor)
    limit.observe(8, 3, 3)  # the request stopped on a drafted token: not a miss
    assert limit.limit == 8


def test_draft_state_feeds_the_limit_and_a_configured_maximum_above_top_stays() -> None:
    s = DraftState(limit=DraftLimit(base=4, top=64))
    s.proposal = Proposal([1, 2, 3, 4], "cursor", 0)
    s.verified([1, 2, 3, 4], [1, 2, 3, 4, 5])
    assert s.limit is not None and s.limit.limit == 8
    assert DraftLimit(base=100, top=64).limit == 100  # top never below the configured one
    start_short = DraftLimit(base=64, top=64, floor=8)  # the engine's default: after a miss,
    start_short.observe(40, 0, 1)  # start short and grow back while the copy holds
    assert start_short.limit == 8
    start_short.observe(7, 7, 8)
    start_short.observe(15, 15, 16)
    assert start_short.limit == 32


def test_a_rename_into_two_tokens_is_learned_and_applied_to_later_occurrences() -> None:
    """50 -> (60, 61): one token of the source became two (a longer identifier)."""
    truth = [u for t in SOURCE for u in ((60, 61) if t == 50 else (t,))] + [2]
    idx = NgramIndex(max_n=3)
    idx.extend([*SOURCE, 1, 10, 11])
    done, proposals = 2, []
    while done < len(truth):
        p, n = copy_step(idx, truth, done, 8)
        proposals.append(p.tokens)
        done += n
    assert idx.replacements.table == {(50,): (60, 61)}
    assert [21, 60, 61, 22, 23] in [p[i:i + 5] for p in proposals for i in range(len(p))]


def test_a_removed_argument_is_learned_as_a_deletion_and_dropped_when_contradicted() -> None:
    source = [7, 8, 10, 11, 30, 31, 12, 13, 14, 15, 16, 17, 10, 11, 30, 31, 12, 18, 19, 20, 21,
              22, 10, 11, 30, 31, 12, 23]
    idx = NgramIndex(max_n=3)
    idx.extend([*source, *range(100, 140), 7, 8])  # the file, the instruction, the answer
    truth = [7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12, 18, 19, 20, 21, 22,
             10, 11, 30, 31, 12, 23, 2]  # (30, 31) removed twice, then kept
    done, learned = 2, False
    while done < len(truth):
        _, n = copy_step(idx, truth, done, 8)
        learned = learned or idx.replacements.table == {(30, 31): ()}
        done += n
    assert learned and not idx.replacements  # dropped where the model kept the original


def test_proposal_ends_map_tokens_to_source_positions_through_replacements() -> None:
    idx = NgramIndex(max_n=2)
    idx.extend([5, 6, 7, 8, 9])
    idx.replacements.add((6, 7), (60,))
    idx.replacements.add((8,), (80, 81))
    p = idx._copy(0, 8, "cursor")
    assert p.tokens == [5, 60, 80, 81, 9]
    assert p.ends == [1, 3, -1, 4, 5]  # inside (80, 81): no source position yet
    assert [i for i, _, _ in p.swaps] == [1, 2]


def test_after_an_inserted_line_the_copy_resumes_where_the_model_left_the_source() -> None:
    """Each "method" (5, 6, body) gets a new line (7, 8x, 9) after its header; the inserted
    tokens appear nowhere in the source, and the indentation-like token 3 is everywhere."""
    source = [1, 5, 6, 3, 40, 41, 42, 3, 43, 44, 5, 6, 3, 50, 51, 52, 3, 53, 54,
              5, 6, 3, 60, 61, 62, 3, 63, 64]
    truth = [1, 5, 6, 3, 7, 80, 9, 3, 40, 41, 42, 3, 43, 44, 5, 6, 3, 7, 81, 9, 3, 50, 51, 52, 3,
             53, 54, 5, 6, 3, 7, 82, 9, 3, 60, 61, 62, 3, 63, 64, 2]
    idx = NgramIndex(max_n=3)
    idx.extend([*source, *range(100, 140), 1, 5])
    done, resumed = 2, []
    while done < len(truth):
        p, n = copy_step(idx, truth, done, 8)
        if p.kind == "anchor":
            resumed.append((p.src, p.tokens[:3]))
        done += n
    # back in the source where each insertion ended (the model said 50 / 60, then the copy
    # goes on), not at an earlier "method" that also starts with 3
    assert (14, [51, 52, 3]) in resumed and (23, [61, 62, 3]) in resumed


def test_a_plain_step_never_measured_is_priced_optimistically_so_it_gets_tried() -> None:
    """Drafting every step, the engine never measures a one-token step; priced from the
    line it looked 2.3 times dearer than it is and drafts of 15% chance still won."""
    cost = StepCost()
    for _ in range(3):
        for n, s in ((3, 0.104), (4, 0.085), (6, 0.110), (16, 0.230)):
            cost.observe(n, s)
    assert cost(1) == pytest.approx(0.104 / 3)
    doubtful = [0.15 * 0.95 ** i for i in range(3)]
    assert allocate([doubtful], 1, 64, cost) == [0]  # no draft: the plain step wins

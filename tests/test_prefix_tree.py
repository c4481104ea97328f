"""The radix tree against a brute-force model of the same queries."""

from __future__ import annotations

import random

from engine.caches.prefix_tree import PrefixTree


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_match_can_end_in_the_middle_of_a_stored_run() -> None:
    t: PrefixTree[str] = PrefixTree()
    t.insert("a", list(range(1500)))
    assert t.common_prefixes([*list(range(1000)), 9999, 1]) == {"a": 1000}
    assert t.stored_prefixes(list(range(1000))) == []  # "a" is longer: not a prefix
    assert t.stored_prefixes(list(range(1600))) == [(1500, "a")]


def test_diverging_entry_is_never_a_stored_prefix() -> None:
    t: PrefixTree[str] = PrefixTree()
    t.insert("short", [1, 2, 3])
    t.insert("long", [1, 2, 3, 4, 5])
    t.insert("other", [1, 2, 9, 9])
    assert t.stored_prefixes([1, 2, 3, 4, 5, 6]) == [(5, "long"), (3, "short")]
    assert t.stored_prefixes([1, 2, 3, 4, 7]) == [(3, "short")]
    assert t.common_prefixes([1, 2, 3, 4, 7]) == {"short": 3, "long": 4, "other": 2}


def test_remove_prunes_and_recompresses() -> None:
    t: PrefixTree[int] = PrefixTree()
    t.insert(1, [1, 2, 3, 4])
    t.insert(2, [1, 2, 5])
    t.remove(2)
    assert len(t.root.children) == 1
    (only,) = t.root.children.values()
    assert only.edge == [1, 2, 3, 4] and not only.children  # split node merged back
    t.remove(1)
    assert not t.root.children and len(t) == 0


def test_reinsert_replaces_a_key() -> None:
    t: PrefixTree[int] = PrefixTree()
    t.insert(0, [1, 2, 3])
    t.insert(0, [7, 8])
    assert t.common_prefixes([1, 2, 3]) == {0: 0}
    assert t.tokens(0) == [7, 8]


def test_random_operations_agree_with_brute_force() -> None:
    rng = random.Random(7)
    t: PrefixTree[int] = PrefixTree()
    model: dict[int, list[int]] = {}
    for _ in range(600):
        key = rng.randrange(12)
        if rng.random() < 0.3 and key in model:
            t.remove(key)
            del model[key]
            continue
        base = model[rng.choice(list(model))] if model and rng.random() < 0.7 else []
        seq = base[: rng.randrange(len(base) + 1)] + [rng.randrange(4) for _ in
                                                      range(rng.randrange(6))]
        t.insert(key, seq)
        model[key] = seq
        query = seq[: rng.randrange(len(seq) + 1)] + [rng.randrange(4) for _ in range(3)]
        assert t.common_prefixes(query) == {k: lcp(v, query) for k, v in model.items()}
        expect = sorted(((len(v), k) for k, v in model.items() if query[: len(v)] == v),
                        reverse=True)
        assert sorted(t.stored_prefixes(query), reverse=True) == expect
        got = t.stored_prefixes(query)
        assert [n for n, _ in got] == sorted((n for n, _ in got), reverse=True)

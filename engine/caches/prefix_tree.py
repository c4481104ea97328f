"""A radix tree over token sequences (pure Python, no llama.cpp).

Each stored sequence has a key (a sequence id for resident KV, a file name for
the disk cache). Edges hold runs of tokens, so a 2,000-token prompt is a few
nodes, not 2,000. Queries walk the request's tokens once:

- ``common_prefixes(tokens)``: for every stored key, how many leading tokens it
  shares with ``tokens`` (a match may end in the middle of a stored run);
- ``stored_prefixes(tokens)``: the stored sequences that are a true prefix of
  ``tokens`` (never one that shares a prefix and then diverges), longest first.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Node(Generic[K]):
    __slots__ = ("children", "edge", "ends", "keys", "parent")

    def __init__(self, edge: list[int], parent: _Node[K] | None) -> None:
        self.edge = edge  # tokens on the edge from the parent to this node
        self.parent = parent
        self.children: dict[int, _Node[K]] = {}
        self.keys: set[K] = set()  # keys whose sequence runs through this node
        self.ends: set[K] = set()  # keys whose sequence ends exactly here


def _common(edge: list[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``edge`` and ``tokens[start:]``."""
    n = len(edge)
    if tokens[start : start + n] == edge:
        return n
    limit = min(n, len(tokens) - start)
    i = 0
    while i < limit and edge[i] == tokens[start + i]:
        i += 1
    return i


class PrefixTree(Generic[K]):
    def __init__(self) -> None:
        self.root: _Node[K] = _Node([], None)
        self._seqs: dict[K, list[int]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def tokens(self, key: K) -> list[int]:
        return self._seqs[key]

    def insert(self, key: K, tokens: Sequence[int]) -> None:
        if key in self._seqs:
            self.remove(key)
        seq = list(tokens)
        self._seqs[key] = seq
        node = self.root
        node.keys.add(key)
        i, n = 0, len(seq)
        while i < n:
            child = node.children.get(seq[i])
            if child is None:
                leaf: _Node[K] = _Node(seq[i:], node)
                node.children[seq[i]] = leaf
                node = leaf
                node.keys.add(key)
                break
            m = _common(child.edge, seq, i)
            if m < len(child.edge):
                child = self._split(child, m)
            node = child
            node.keys.add(key)
            i += m
        node.ends.add(key)

    def _split(self, child: _Node[K], m: int) -> _Node[K]:
        parent = child.parent
        assert parent is not None
        mid: _Node[K] = _Node(child.edge[:m], parent)
        mid.keys = set(child.keys)
        child.edge = child.edge[m:]
        child.parent = mid
        mid.children[child.edge[0]] = child
        parent.children[mid.edge[0]] = mid
        return mid

    def remove(self, key: K) -> None:
        seq = self._seqs.pop(key, None)
        if seq is None:
            return
        path = [self.root]
        node, i = self.root, 0
        while i < len(seq):
            node = node.children[seq[i]]
            path.append(node)
            i += len(node.edge)
        node.ends.discard(key)
        for n in path:
            n.keys.discard(key)
        for n in reversed(path[1:]):
            parent = n.parent
            assert parent is not None
            if not n.keys:
                del parent.children[n.edge[0]]
            elif not n.ends and len(n.children) == 1:  # re-compress a pass-through node
                (only,) = n.children.values()
                only.edge = n.edge + only.edge
                only.parent = parent
                parent.children[only.edge[0]] = only

    def _path(self, tokens: Sequence[int]) -> list[tuple[_Node[K], int, bool]]:
        """The nodes ``tokens`` walks through: (node, depth reached, whole edge matched);
        only the last may be matched partway."""
        path: list[tuple[_Node[K], int, bool]] = [(self.root, 0, True)]
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            m = _common(child.edge, tokens, i)
            i += m
            path.append((child, i, m == len(child.edge)))
            if m < len(child.edge):
                break
            node = child
        return path

    def common_prefixes(self, tokens: Sequence[int]) -> dict[K, int]:
        """Every stored key -> length of its common prefix with ``tokens``."""
        found: dict[K, int] = {}
        for node, depth, _ in reversed(self._path(tokens)):
            for key in node.keys:
                found.setdefault(key, depth)
        return found

    def stored_prefixes(self, tokens: Sequence[int]) -> list[tuple[int, K]]:
        """Stored sequences that are a prefix of ``tokens``: (length, key), longest first."""
        return [(depth, key) for node, depth, whole in reversed(self._path(tokens)) if whole
                for key in node.ends]

"""One grammar-constrained step: the token the chain [grammar, pointwise, truncation,
choice] picks, asking llama.cpp's grammar about as few candidates as gives exactly that
token (engine thread).

In order, until one decides:

1. after a step whose mask allowed few tokens (``NARROW``), llguidance's mask first;
2. the grammar asked about the best few candidates (``_first_checked``), then up to the best
   ``CHECK`` (from the request's window when nothing pointwise comes first), then the best
   ``32 * CHECK``: ``engine.sampling.grammar_plan`` says when they decide;
3. llguidance's mask (``engine.sampling.masks``), llama.cpp's grammar confirming the token;
4. the grammar over every candidate, as llama.cpp would.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

from engine.sampling.candidates import TOKEN_DATA, Candidates, token_array
from engine.sampling.grammar_plan import (
    CHECK,
    Plan,
    Truncation,
    allowed_sorted,
    greedy_choice,
    sampling_plan,
)
from engine.sampling.lazy_trigger import TriggerWatch
from engine.sampling.masks import MaskEngine

L: Any = llama_cpp  # the C API, untyped (see engine.runner)

# a mask that allowed at most this many tokens sends the next step to the mask first: such
# steps (keys, enums, punctuation) come in runs, and their few allowed tokens are seldom
# all among the best candidates of a model that does not know the format
NARROW = 128
FIRST_GREEDY = 8  # candidates a greedy step checks first
FIRST_MARGIN = 8  # beyond top_k, candidates a top_k step checks first


@dataclass
class GrammarChain:
    """A grammar-constrained request's samplers: the chain [grammar, pre, trunc, choice]
    kept in parts (``pre``: logit bias and penalties; ``trunc``: top_k / top_p / min_p;
    ``choice``: greedy or temperature + dist), with how often the grammar was checked on
    the best candidates only (``fast``) or on all of them (``full``)."""

    pre: Any
    trunc: Any
    choice: Any
    grammar: Any
    truncation: Truncation
    greedy: bool
    fast: int = 0
    full: int = 0
    text: str = ""  # the GBNF (for a mask engine's matcher, made when first needed)
    taken: list[int] = field(default_factory=list)  # tokens the grammar accepted
    matcher: Any = None  # llguidance's, following the grammar (engine.sampling.masks)
    unmasked: bool = False  # no matcher for this request (lazy grammar, or it diverged)
    watch: TriggerWatch | None = None  # a lazy grammar's trigger, until it fires
    masked: int = 0  # steps decided through the matcher's mask
    narrow: bool = False  # the last step's mask allowed few tokens: ask the mask first
    floor: float = -np.inf  # where the next token's window of candidates starts

    def parts(self) -> tuple[Any, ...]:
        return (self.pre, self.trunc, self.choice, self.grammar)


class GrammarSteps:
    """Runs the constrained steps of one context's requests."""

    def __init__(self, vocab: Any, n_vocab: int, candidates: Candidates) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.cand = candidates
        # checked first: the best CHECK candidates, then (if they do not decide) the best
        # 32 x CHECK, then all (bounded by the vocabulary)
        self._checks = [(n, L.llama_sampler_init_top_k(n)) for n in (CHECK, 32 * CHECK)
                        if n < n_vocab]
        self.fast = True  # False: the grammar checks every candidate (tests, bench)
        self.windows = True  # False: no window of candidates (tests, bench)
        # llguidance's masks where the best candidates do not decide (None: off)
        self.masks: MaskEngine | None = MaskEngine(vocab, n_vocab)
        self._eog: Any = None  # the end-of-generation ids, read when first needed

    def close(self) -> None:
        for _, top in self._checks:
            L.llama_sampler_free(top)
        self._checks = []
        if self.masks is not None:
            self.masks.close()  # its tokenizer build reads the vocabulary: done first

    def watch_trigger(self, g: GrammarChain, triggers: tuple[str, ...]) -> None:
        """Masks for a lazy grammar once its trigger fires; the tokenizer built early."""
        if self.masks is not None and triggers:
            g.watch = TriggerWatch.of(triggers)
        if self.masks is not None and (g.watch or not g.unmasked):
            self.masks.start()  # the model's first constrained request: its tokenizer

    def sample(self, g: GrammarChain, batch_index: int) -> int:
        """The token the chain picks (and accepted by every part of it)."""
        if not self.fast:
            full = self._sample_full(g, batch_index)
            self.accept(g, full)
            return full
        token: int | None = None
        if g.narrow:  # likely another structural step, which the best candidates rarely decide
            token = self._sample_masked(g, batch_index, most=NARROW)
            if token is not None:
                g.masked += 1
                self.accept(g, token)
                return token
        windowed = False
        if g.pre is None and self.windows and self._checks:
            # a window that holds the candidates the first check needs (it may hold fewer
            # than CHECK: everything outside it is under its last, so that is the boundary)
            cur = self.cand.windowed(self.cand.row(batch_index), g, _first_checked(g, CHECK))
            if cur is not None:  # the best of a window, not of the whole vocabulary
                windowed = True
                token = self._sample_checked_in(g, cur, min(cur.size, CHECK),
                                                self._checks[0][1], self.cand.window)
        if token is None and not (windowed and self.masks is not None and not g.unmasked):
            for size, top in self._checks:
                token = self._sample_checked(g, batch_index, size, top)
                if token is not None:
                    break
        if token is None:
            token = self._sample_masked(g, batch_index)
            if token is None:
                g.full += 1
                token = self._sample_full(g, batch_index)
            else:
                g.masked += 1
        else:
            g.fast += 1
        self.accept(g, token)
        return token

    def accept(self, g: GrammarChain, token: int) -> None:
        for part in (g.grammar, g.pre, g.trunc, g.choice):
            if part:
                L.llama_sampler_accept(part, token)
        if g.watch is not None:
            self._watch(g, token)
        elif not g.unmasked:
            g.taken.append(token)
            if g.matcher is not None and not g.matcher.consume_token(token):
                g.matcher, g.unmasked = None, True

    def forced(self, g: GrammarChain, most: int) -> list[int]:
        """Up to ``most`` tokens the grammar forces next, in llguidance's canonical split
        (``compute_ff_tokens``: tokens no other continuation or tokenization could
        replace); [] when none, or when there is no matcher to ask (a lazy grammar before
        its trigger, one llguidance cannot read)."""
        if g.unmasked or g.watch is not None or self.masks is None or not self.fast:
            return []
        if g.matcher is None:
            g.matcher = self.masks.matcher(g.text, g.taken)
            if g.matcher is None:
                g.unmasked = True
                return []
        if not g.matcher.compute_ff_bytes():  # (a fraction of a microsecond; most steps)
            return []
        tokens: list[int] = g.matcher.compute_ff_tokens()[:most]
        eog = next((i for i, t in enumerate(tokens) if L.llama_vocab_is_eog(self.vocab, t)),
                   None)
        return tokens if eog is None else tokens[:eog]

    def take_forced(self, g: GrammarChain, token: int) -> bool:
        """Take a forced token as if sampled, once llama.cpp's grammar confirms it (False:
        the engines disagree; the request goes on without llguidance, as in
        ``_sample_masked``)."""
        one = np.zeros(1, TOKEN_DATA)
        one["id"] = token
        L.llama_sampler_apply(g.grammar, ctypes.byref(token_array(one, 1)))
        if not np.isfinite(one["logit"][0]):
            g.matcher, g.unmasked = None, True
            return False
        self.accept(g, token)
        return True

    def _sample_masked(self, g: GrammarChain, batch_index: int,
                       most: int | None = None) -> int | None:
        """The token, from the samplers run on the tokens llguidance's mask allows (llama.cpp's
        grammar confirming the one chosen); None when there is no matcher to ask, or the
        mask allows more than ``most`` tokens."""
        if g.unmasked or self.masks is None:
            return None
        if g.matcher is None:
            g.matcher = self.masks.matcher(g.text, g.taken)
            if g.matcher is None:
                g.unmasked = True
                return None
        ids = self.masks.allowed(g.matcher)
        g.narrow = len(ids) <= NARROW
        if most is not None and len(ids) > most:
            return None
        if g.matcher.is_accepting():  # complete: llama.cpp's grammar lets every end through
            ids = np.union1d(ids, self._eog_ids())  # (llguidance only the one it was given)
        if not len(ids):
            return None
        cand = np.zeros(len(ids), TOKEN_DATA)
        cand["id"] = ids
        cand["logit"] = self.cand.row(batch_index)[ids]
        cur = token_array(cand, len(ids))
        for part in (g.pre, g.trunc, g.choice):
            if part:
                L.llama_sampler_apply(part, ctypes.byref(cur))
        token = int(cand["id"][cur.selected])
        one = np.zeros(1, TOKEN_DATA)
        one["id"] = token
        L.llama_sampler_apply(g.grammar, ctypes.byref(token_array(one, 1)))
        if not np.isfinite(one["logit"][0]):  # the engines disagree: llama.cpp's rules
            g.matcher, g.unmasked = None, True
            return None
        return token

    def _eog_ids(self) -> Any:
        if self._eog is None:
            self._eog = np.array([t for t in range(self.n_vocab)
                                  if L.llama_vocab_is_eog(self.vocab, t)], dtype=np.intp)
        return self._eog

    def _sample_checked(self, g: GrammarChain, batch_index: int, size: int,
                        top: Any) -> int | None:
        """The token, from the grammar checked on the best ``size`` candidates only; None
        when those do not decide it."""
        cur = self.cand.every(batch_index)
        if g.pre:
            L.llama_sampler_apply(g.pre, ctypes.byref(cur))
        return self._sample_checked_in(g, cur, size, top, self.cand.all)

    def _sample_checked_in(self, g: GrammarChain, cur: Any, size: int, top: Any,
                           buffer: Any) -> int | None:
        """The token from the grammar checked on the best ``size`` of the candidates ``cur``
        (over ``buffer``, which holds every candidate at or above the ``size``-th best).
        The grammar is asked about the best few first (``_first_checked``): when they decide, the
        others are never checked (checking costs about a microsecond per candidate)."""
        apply, ref = L.llama_sampler_apply, ctypes.byref
        apply(top, ref(cur))  # the best `size` first, sorted; size `size`
        first = _first_checked(g, size)
        logits = buffer["logit"]
        boundary, last = float(logits[first - 1]), float(logits[size - 1])
        cur.size = first
        apply(g.grammar, ref(cur))
        token = self._decide(g, cur, buffer[:first], boundary)
        if token is not None or first == size:
            return token
        rest = L.llama_token_data_array(ctypes.cast(
            buffer.ctypes.data + first * buffer.itemsize, L.llama_token_data_p),
            size - first, -1, True)
        apply(g.grammar, ref(rest))
        cur.size = size
        return self._decide(g, cur, buffer[:size], last)

    def _decide(self, g: GrammarChain, cur: Any, head: Any, boundary: float) -> int | None:
        """The token, when the allowed candidates among ``head`` (the grammar checked them;
        ``cur`` is the array over them, best first) decide it; None otherwise."""
        k = g.truncation.top_k
        n = len(head)
        if 0 < k < n and not g.greedy:
            # top_k: when the best k allowed are all among the checked ones, the chain runs
            # in place on the allowed checked candidates, which keep top_k's order (best
            # first, up to exact ties, as below)
            allowed = np.isfinite(head["logit"])
            m = int(np.count_nonzero(allowed))
            if m >= k:
                kept = head[allowed] if m < n else head
                if float(kept["logit"][k - 1]) > boundary:
                    if m < n:
                        head[:m] = kept
                    cur.size, cur.sorted = m, True
                    if g.trunc:
                        L.llama_sampler_apply(g.trunc, ctypes.byref(cur))
                    L.llama_sampler_apply(g.choice, ctypes.byref(cur))
                    return int(cur.data[cur.selected].id)
        return self._plan_and_choose(g, head, boundary)  # (greedy; min_p may decide)

    def _plan_and_choose(self, g: GrammarChain, head: Any, boundary: float) -> int | None:
        ids, logits = allowed_sorted(head["id"], head["logit"])
        if g.greedy:
            return greedy_choice(ids, logits, boundary)
        plan = sampling_plan(logits, boundary, g.truncation)
        return None if plan is None else self._choose(g, ids, logits, plan)

    def _watch(self, g: GrammarChain, token: int) -> None:
        """A lazy grammar's text so far: once its trigger fires at a token's start, the
        tokens from there on are what llama.cpp's grammar consumed, and the matcher
        (made on the next step that needs it) follows from them."""
        assert g.watch is not None and self.masks is not None
        if not self.masks.enabled:  # no tokenizer after all
            g.watch = None
            return
        fired = g.watch.feed(token, self.masks.pieces)  # (None: still being built)
        if fired is not None:
            g.watch = None
            if fired:
                g.taken, g.unmasked = fired, False

    def _choose(self, g: GrammarChain, ids: Any, logits: Any, plan: Plan) -> int | None:
        n = len(ids)
        sorts = g.truncation.sorts
        if not sorts:  # min_p alone filters in place: the full path's array is in id order
            order = np.argsort(ids)
            ids, logits = ids[order], logits[order]
        kept = np.zeros(n, TOKEN_DATA)
        kept["id"], kept["logit"] = ids, logits
        cur = token_array(kept, n, sorts)
        if g.trunc:
            L.llama_sampler_apply(g.trunc, ctypes.byref(cur))
        if plan.expected is not None and cur.size != plan.expected:
            return None
        L.llama_sampler_apply(g.choice, ctypes.byref(cur))
        return int(cur.data[cur.selected].id)

    def _sample_full(self, g: GrammarChain, batch_index: int) -> int:
        apply, ref = L.llama_sampler_apply, ctypes.byref
        cur = self.cand.every(batch_index)
        for part in (g.grammar, g.pre, g.trunc, g.choice):
            if part:
                apply(part, ref(cur))
        return int(cur.data[cur.selected].id)


def _first_checked(g: GrammarChain, size: int) -> int:
    """How many of the best candidates the grammar is asked about first: a few more than
    the chain keeps (top_k's k; greedy's one), so that a few disallowed ones still leave
    enough."""
    if g.greedy:
        return min(size, FIRST_GREEDY)
    k = g.truncation.top_k
    return min(size, k + FIRST_MARGIN) if k > 0 else size

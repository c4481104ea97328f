"""Per-request sampler chains over llama.cpp's samplers (engine thread; a grammar has
been parsed once already, in ``engine.sampling.grammar_check``'s child process).

A request without a grammar gets a ``Chain``: one llama.cpp chain of logit bias and
penalties, then top_k / top_p / min_p, then greedy or temperature + dist. With a grammar it
gets a ``GrammarChain``, the same samplers kept in parts, so that the grammar is asked about
the best candidates only whenever ``engine.sampling.grammar_plan`` shows that gives exactly
what asking it about every candidate would.

``llama_sampler_sample`` starts by copying every logit of the vocabulary into a candidate
array, and top_k then sorts through all of them: over a 50k-150k vocabulary that is most of
a sampled token's cost. Two exact shortcuts skip it (``Chain``): plain greedy is the first
highest logit (numpy's argmax, which breaks ties the same way), and a chain that starts with
top_k picks the same token from any candidates that contain the k best, so it is handed
only the logits above a window under the maximum.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

from engine.request import SamplingParams
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

# a top_k chain's next floor lets in about this many times k of the current logits (at
# least WINDOW_MIN_RANKS): a margin for the next token's logits to lie lower
WINDOW_RANKS = 4
WINDOW_MIN_RANKS = 256
WINDOW = 4.0  # the first window under the highest logit when the floor lets too few in
# a mask that allowed at most this many tokens sends the next step to the mask first: such
# steps (keys, enums, punctuation) come in runs, and their few allowed tokens are seldom
# all among the best candidates of a model that does not know the format
NARROW = 128
FIRST_GREEDY = 8  # candidates a greedy step checks first
FIRST_MARGIN = 8  # beyond top_k, candidates a top_k step checks first


def _address_binding() -> Any:
    """``llama_get_logits_ith`` returning the address as an int (the bindings' version
    returns a ctypes float pointer, slower to turn into a numpy view)."""
    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
    return fn(("llama_get_logits_ith", L.llama_cpp._lib))


_logits_address = _address_binding()
_NONE = np.zeros(0, np.intp)
MAX_ROW_VIEWS = 4096  # logits row views kept (one per batch position in use)

# llama_token_data {id, logit, p} as a numpy record, for candidate arrays built in numpy
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@dataclass
class Chain:
    """A request's samplers without a grammar: one llama.cpp chain (``ptr``) and how it can
    be run on fewer candidates than the whole vocabulary. ``argmax``: plain greedy (no
    logit bias, no penalties), the token is the first highest logit. ``top_k`` (> 0): the
    chain's first sampler is top_k, so it is given the candidates at or above ``floor``
    when at least ``top_k`` of them are (the floor follows the request's logits from
    token to token); otherwise the whole vocabulary, as llama.cpp does."""

    ptr: Any
    argmax: bool = False
    top_k: int = 0
    floor: float = -np.inf  # the logit the candidates of the next token start at
    windowed: int = 0  # tokens sampled from the window
    full: int = 0  # tokens sampled from the whole vocabulary


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


class Samplers:
    """Makes, runs and frees the samplers of one context's requests."""

    def __init__(self, vocab: Any, n_vocab: int, ctx: Any) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.ctx = ctx
        # the candidate buffer for grammar sampling, made on first use
        self._cand: Any = None
        self._cand_ids: Any = None
        self._cand_ptr: Any = None
        # checked first: the best CHECK candidates, then (if they do not decide) the best
        # 32 x CHECK, then all (bounded by the vocabulary)
        self._checks = [(n, L.llama_sampler_init_top_k(n)) for n in (CHECK, 32 * CHECK)
                        if n < n_vocab]
        self.grammar_fast = True  # False: the grammar checks every candidate (tests, bench)
        # llguidance's masks where the best candidates do not decide (None: off)
        self.masks: MaskEngine | None = MaskEngine(vocab, n_vocab)
        self._eog: Any = None  # the end-of-generation ids, read when first needed
        self.shortcuts = True  # False: every Chain samples the whole vocabulary (tests, bench)
        self._row_type = ctypes.c_float * n_vocab
        self._above = np.empty(n_vocab, np.bool_)  # which logits clear a window's floor
        self._rows: dict[int, Any] = {}  # numpy views of logits rows, by address
        # the candidates a top_k chain samples from (grown on demand)
        self.n_window = 0
        self._window: Any = None
        self._window_fields: tuple[Any, Any, Any] = (None, None, None)  # its columns
        self._window_address = 0
        self._window_ptr: Any = None

    def close(self) -> None:
        for _, top in self._checks:
            L.llama_sampler_free(top)
        self._checks = []
        if self.masks is not None:
            self.masks.close()  # its tokenizer build reads the vocabulary: done first

    def new(self, p: SamplingParams, history: Sequence[int]) -> Any:
        """The request's sampler: one llama.cpp chain, or with a grammar a ``GrammarChain``
        (the same samplers in parts, so the grammar can check only the best candidates)."""
        if p.grammar:
            return self._grammar_chain(p, history)
        chain = self._chain()
        pointwise = bool(p.logit_bias or p.penalized)
        if pointwise:
            self._add_pointwise(chain, p, history)
        self._add_choice(chain, p)
        return Chain(chain, argmax=p.greedy and not pointwise,
                     top_k=0 if pointwise or p.greedy or p.top_k >= self.n_vocab else
                     max(p.top_k, 0))

    @staticmethod
    def _chain() -> Any:
        sp = L.llama_sampler_chain_default_params()
        sp.no_perf = True
        return L.llama_sampler_chain_init(sp)

    def _add_pointwise(self, chain: Any, p: SamplingParams, history: Sequence[int]) -> None:
        """Logit bias and penalties: each changes a token's logit by itself (so they commute
        with the grammar, which only sets disallowed logits to -inf)."""
        add = L.llama_sampler_chain_add
        if p.logit_bias:
            arr = (L.llama_logit_bias * len(p.logit_bias))()
            for i, (tok, bias) in enumerate(p.logit_bias):
                arr[i].token = tok
                arr[i].bias = bias
            add(chain, L.llama_sampler_init_logit_bias(self.n_vocab, len(p.logit_bias), arr))
        if p.penalized:
            penalties = L.llama_sampler_init_penalties(
                self.n_vocab, p.penalty_last_n, p.repeat_penalty, p.frequency_penalty,
                p.presence_penalty)
            for tok in history[-p.penalty_last_n:] if p.penalty_last_n > 0 else history:
                if tok >= 0:  # the prompt counts (not its media), the grammar not
                    L.llama_sampler_accept(penalties, tok)
            add(chain, penalties)

    @staticmethod
    def _add_truncation(chain: Any, p: SamplingParams) -> None:
        add = L.llama_sampler_chain_add
        if p.top_k > 0:
            add(chain, L.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            add(chain, L.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            add(chain, L.llama_sampler_init_min_p(p.min_p, 1))

    def _add_choice(self, chain: Any, p: SamplingParams, truncation: bool = True) -> None:
        add = L.llama_sampler_chain_add
        if p.greedy:
            add(chain, L.llama_sampler_init_greedy())
            return
        if truncation:
            self._add_truncation(chain, p)
        add(chain, L.llama_sampler_init_temp(p.temperature))
        add(chain, L.llama_sampler_init_dist(p.seed))

    def _grammar_chain(self, p: SamplingParams, history: Sequence[int]) -> GrammarChain:
        pre = None
        if p.logit_bias or p.penalized:
            pre = self._chain()
            self._add_pointwise(pre, p, history)
        trunc = None
        if not p.greedy and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0):
            trunc = self._chain()
            self._add_truncation(trunc, p)
        choice = self._chain()
        self._add_choice(choice, p, truncation=False)
        g = GrammarChain(pre, trunc, choice, None,
                         Truncation(p.top_k, p.top_p, p.min_p), p.greedy,
                         text=p.grammar or "", unmasked=bool(p.grammar_triggers))
        if self.masks is not None and p.grammar_triggers:
            g.watch = TriggerWatch.of(tuple(p.grammar_triggers))  # masks once it fires
        if self.masks is not None and (g.watch or not g.unmasked):
            self.masks.start()  # the model's first constrained request: its tokenizer
        try:
            g.grammar = self._grammar_sampler(p, None)
        except ValueError:
            self.free(g)
            raise
        return g

    def _grammar_sampler(self, p: SamplingParams, chain: Any | None) -> Any:
        assert p.grammar is not None
        text, root = p.grammar.encode(), b"root"
        if p.grammar_triggers:
            patterns = (ctypes.c_char_p * len(p.grammar_triggers))(
                *[t.encode() for t in p.grammar_triggers])
            sampler = L.llama_sampler_init_grammar_lazy_patterns(
                self.vocab, text, root, patterns, len(p.grammar_triggers), None, 0)
        else:
            sampler = L.llama_sampler_init_grammar(self.vocab, text, root)
        if not sampler:
            if chain is not None:
                L.llama_sampler_free(chain)
            raise ValueError("llama.cpp could not parse the grammar")
        return sampler

    def free(self, sampler: Any) -> None:
        if isinstance(sampler, GrammarChain):
            for part in (sampler.pre, sampler.trunc, sampler.choice, sampler.grammar):
                if part:
                    L.llama_sampler_free(part)
        elif sampler:
            L.llama_sampler_free(sampler.ptr)

    def accept(self, sampler: Any, token: int) -> None:
        """A token chosen without sampling (a forced one): the grammar and penalties see it
        as if it had been sampled."""
        if isinstance(sampler, GrammarChain):
            self._accept(sampler, token)
        else:
            L.llama_sampler_accept(sampler.ptr, token)

    def sample(self, sampler: Any, batch_index: int) -> int:
        if isinstance(sampler, GrammarChain):
            return self._sample_grammar(sampler, batch_index)
        if sampler.argmax and self.shortcuts:  # greedy keeps no state: nothing to accept
            return int(self._logits(batch_index).argmax())
        if sampler.top_k and self.shortcuts:
            token = self._sample_window(sampler, batch_index)
            if token is not None:
                return token
        sampler.full += 1
        return int(L.llama_sampler_sample(sampler.ptr, self.ctx, batch_index))

    def _logits(self, batch_index: int) -> Any:
        """The output row of batch position ``batch_index``, as a numpy view."""
        address = _logits_address(self.ctx, batch_index)
        if not address:
            raise ValueError(f"no logits at batch position {batch_index}")
        row = self._rows.get(address)  # a view is only an address and a length: the same
        if row is None:  # address is the same row, whatever buffer holds it now
            if len(self._rows) >= MAX_ROW_VIEWS:
                self._rows.clear()
            row = self._rows[address] = np.frombuffer(
                self._row_type.from_address(address), dtype=np.float32)  # type: ignore[call-overload]
        return row

    def _sample_window(self, c: Chain, batch_index: int) -> int | None:
        """The chain run on the logits at or above ``c.floor`` (``_windowed``), when at
        least ``c.top_k`` are there: they include the k best, so top_k keeps the same k,
        and everything after it (top_p, min_p, temperature, dist) sees the same k. None:
        the caller samples the whole vocabulary."""
        cur = self._windowed(self._logits(batch_index), c, c.top_k)
        if cur is None:
            return None
        L.llama_sampler_apply(c.ptr, ctypes.byref(cur))
        token = int(self._window_fields[0][cur.selected])  # (samplers reorder in place)
        L.llama_sampler_accept(c.ptr, token)
        c.windowed += 1
        return token

    def _windowed(self, row: Any, c: Chain | GrammarChain, k: int) -> Any:
        """The logits at or above ``c.floor``, in id order as llama.cpp's array is, as a
        llama_token_data_array over the window buffer, when at least ``k`` are there. With
        too few the floor drops to a window under the highest logit, then widens (None
        after three tries). The next token's floor is set to let about ``WINDOW_RANKS * k``
        of this token's logits in."""
        if c.floor > -np.inf:  # (a float32 floor: a Python float costs a third more)
            np.greater_equal(row, np.float32(c.floor), out=self._above)
            ids = self._above.nonzero()[0]
        else:
            ids = _NONE
        if len(ids) < k:
            peak, window = float(row.max()), WINDOW
            for _ in range(3):
                ids = np.flatnonzero(row >= peak - window)
                if len(ids) >= k:
                    break
                window *= 4.0
            else:
                c.floor = -np.inf
                return None
            c.floor = peak - window  # the adjustments below start from the window used
        n = len(ids)
        if n > self.n_window:
            self._grow_window(n)
        logits = row[ids]
        target = max(WINDOW_RANKS * k, WINDOW_MIN_RANKS)
        if n > 2 * target:  # too wide: raise the floor to the target's rank
            c.floor = float(np.partition(logits, n - target)[n - target])
        elif n < 2 * k:  # nearly too narrow: lower it by the spread of the k best
            c.floor -= float(logits.max()) - float(np.partition(logits, n - k)[n - k])
        cand_id, cand_logit, cand_p = self._window_fields
        cand_id[:n] = ids
        cand_logit[:n] = logits
        cand_p[:n] = 0.0
        return L.llama_token_data_array(self._window_ptr, n, -1, False)

    def _grow_window(self, n: int) -> None:
        self.n_window = min(self.n_vocab, max(n, 2 * self.n_window))
        self._window = np.zeros(self.n_window, _TOKEN_DATA)
        self._window_fields = (self._window["id"], self._window["logit"], self._window["p"])
        self._window_address = self._window.ctypes.data
        self._window_ptr = ctypes.cast(self._window_address, L.llama_token_data_p)

    def _candidates(self, batch_index: int) -> Any:
        """Every token with its logit, in id order, as a llama_token_data_array over the
        runner's reusable buffer (the samplers reorder it in place)."""
        if self._cand is None:
            self._cand = np.zeros(self.n_vocab, _TOKEN_DATA)
            self._cand_ids = np.arange(self.n_vocab, dtype=np.int32)
            self._cand_ptr = self._cand.ctypes.data_as(L.llama_token_data_p)
        ptr = L.llama_get_logits_ith(self.ctx, batch_index)
        self._cand["id"] = self._cand_ids
        self._cand["logit"] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        self._cand["p"] = 0.0
        return L.llama_token_data_array(self._cand_ptr, self.n_vocab, -1, False)

    def _sample_grammar(self, g: GrammarChain, batch_index: int) -> int:
        """The token the chain [grammar, pointwise, truncation, choice] picks, checking the
        grammar on the best ``CHECK`` candidates only when that decides the result
        (``engine.sampling.grammar_plan``), else on every candidate."""
        if not self.grammar_fast:
            full = self._sample_full(g, batch_index)
            self._accept(g, full)
            return full
        token: int | None = None
        if g.narrow:  # likely another structural step, which the best candidates rarely decide
            token = self._sample_masked(g, batch_index, most=NARROW)
            if token is not None:
                g.masked += 1
                self._accept(g, token)
                return token
        windowed = False
        if g.pre is None and self.shortcuts and self._checks:
            cur = self._windowed(self._logits(batch_index), g, CHECK)
            if cur is not None:  # the best CHECK of a window, not of the whole vocabulary
                windowed = True
                token = self._sample_checked_in(g, cur, CHECK, self._checks[0][1],
                                                self._window)
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
        self._accept(g, token)
        return token

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
        cand = np.zeros(len(ids), _TOKEN_DATA)
        cand["id"] = ids
        cand["logit"] = self._logits(batch_index)[ids]
        cur = L.llama_token_data_array(cand.ctypes.data_as(L.llama_token_data_p), len(ids),
                                       -1, False)
        for part in (g.pre, g.trunc, g.choice):
            if part:
                L.llama_sampler_apply(part, ctypes.byref(cur))
        token = int(cand["id"][cur.selected])
        one = np.zeros(1, _TOKEN_DATA)
        one["id"] = token
        L.llama_sampler_apply(g.grammar, ctypes.byref(L.llama_token_data_array(
            one.ctypes.data_as(L.llama_token_data_p), 1, -1, False)))
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
        cur = self._candidates(batch_index)
        if g.pre:
            L.llama_sampler_apply(g.pre, ctypes.byref(cur))
        return self._sample_checked_in(g, cur, size, top, self._cand)

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

    def _accept(self, g: GrammarChain, token: int) -> None:
        for part in (g.grammar, g.pre, g.trunc, g.choice):
            if part:
                L.llama_sampler_accept(part, token)
        if g.watch is not None:
            self._watch(g, token)
        elif not g.unmasked:
            g.taken.append(token)
            if g.matcher is not None and not g.matcher.consume_token(token):
                g.matcher, g.unmasked = None, True

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
        kept = np.zeros(n, _TOKEN_DATA)
        kept["id"], kept["logit"] = ids, logits
        cur = L.llama_token_data_array(kept.ctypes.data_as(L.llama_token_data_p), n, -1, sorts)
        if g.trunc:
            L.llama_sampler_apply(g.trunc, ctypes.byref(cur))
        if plan.expected is not None and cur.size != plan.expected:
            return None
        L.llama_sampler_apply(g.choice, ctypes.byref(cur))
        return int(cur.data[cur.selected].id)

    def _sample_full(self, g: GrammarChain, batch_index: int) -> int:
        apply, ref = L.llama_sampler_apply, ctypes.byref
        cur = self._candidates(batch_index)
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

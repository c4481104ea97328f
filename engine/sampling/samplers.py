"""Per-request sampler chains over llama.cpp's samplers (engine thread; a grammar has
been parsed once already, in ``engine.sampling.grammar_check``'s child process).

A request without a grammar gets a ``Chain``: one llama.cpp chain of logit bias and
penalties, then top_k / top_p / min_p, then greedy or temperature + dist. With a grammar it
gets a ``GrammarChain``, the same samplers kept in parts, run by
``engine.sampling.grammar_step`` so that the grammar is asked about the best candidates only
whenever ``engine.sampling.grammar_plan`` shows that gives exactly what asking it about
every candidate would.

``llama_sampler_sample`` starts by copying every logit of the vocabulary into a candidate
array, and top_k then sorts through all of them: over a 50k-150k vocabulary that is most of
a sampled token's cost. Two exact shortcuts skip it (``Chain``): plain greedy is the first
highest logit (numpy's argmax, which breaks ties the same way), and a chain that starts with
top_k picks the same token from any candidates that contain the k best, so it is handed
only the logits above a window under the maximum (``engine.sampling.candidates``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from engine.request import SamplingParams
from engine.sampling.backend import BackendSampling
from engine.sampling.candidates import Candidates
from engine.sampling.grammar_plan import Truncation
from engine.sampling.grammar_step import GrammarChain, GrammarSteps
from engine.sampling.masks import MaskEngine

L: Any = llama_cpp  # the C API, untyped (see engine.runner)

# llama.cpp's graph forms it cannot take: top_k past the vocabulary aborts the process,
# and min_p keeps the logits strictly above max + ln(min_p), so at 1 (or where ln(min_p)
# is under the maximum's rounding) it keeps none and samples garbage. Such requests
# sample in Python.
BACKEND_MIN_P_MAX = 0.99


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
    # llama.cpp may run it in its graph (engine.sampling.backend): how it samples (None: no)
    key: tuple[object, ...] | None = None
    seed: int = 0
    seq: int | None = None  # the sequence it is attached to there
    live: bool = False  # the last decode sampled with it attached: read llama.cpp's token


class Samplers:
    """Makes, runs and frees the samplers of one context's requests."""

    def __init__(self, vocab: Any, n_vocab: int, ctx: Any, backend: bool = False) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.ctx = ctx
        self.backend = BackendSampling(ctx) if backend else None
        self.cand = Candidates(ctx, n_vocab)
        self.grammar = GrammarSteps(vocab, n_vocab, self.cand)
        self._shortcuts = True

    @property
    def shortcuts(self) -> bool:
        """False: every step samples the whole vocabulary, with no window (tests, bench)."""
        return self._shortcuts

    @shortcuts.setter
    def shortcuts(self, on: bool) -> None:
        self._shortcuts = self.grammar.windows = on

    @property
    def grammar_fast(self) -> bool:
        """False: the grammar checks every candidate (tests, bench)."""
        return self.grammar.fast

    @grammar_fast.setter
    def grammar_fast(self, on: bool) -> None:
        self.grammar.fast = on

    @property
    def masks(self) -> MaskEngine | None:
        """llguidance's masks where the best candidates do not decide (None: off)."""
        return self.grammar.masks

    @masks.setter
    def masks(self, engine: MaskEngine | None) -> None:
        self.grammar.masks = engine

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
        self.grammar.close()

    def new(self, p: SamplingParams, history: Sequence[int], seq: int = -1) -> Any:
        """The request's sampler: one llama.cpp chain, or with a grammar a ``GrammarChain``
        (the same samplers in parts, so the grammar can check only the best candidates).
        With backend sampling, an idle chain of ``seq`` that samples the same way."""
        if p.grammar:
            return self._grammar_chain(p, history)
        pointwise = bool(p.logit_bias or p.penalized)
        key = None
        if self.backend is not None and not pointwise and p.logprobs is None \
                and p.top_k <= self.n_vocab and p.min_p <= BACKEND_MIN_P_MAX:
            key = (p.greedy, p.top_k, p.top_p, p.min_p, p.temperature)
            idle = self.backend.reuse(key, p.seed, p.seeded, seq)
            if idle is not None:
                return idle
        chain = self._chain()
        if pointwise:
            self._add_pointwise(chain, p, history)
        self._add_choice(chain, p)
        return Chain(chain, argmax=p.greedy and not pointwise,
                     top_k=0 if pointwise or p.greedy or p.top_k >= self.n_vocab else
                     max(p.top_k, 0), key=key, seed=p.seed)

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
        self.grammar.watch_trigger(g, p.grammar_triggers)
        try:
            g.grammar = self._grammar_sampler(p)
        except ValueError:
            self.free(g)
            raise
        return g

    def _grammar_sampler(self, p: SamplingParams) -> Any:
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
            raise ValueError("llama.cpp could not parse the grammar")
        return sampler

    def free(self, sampler: Any) -> None:
        if isinstance(sampler, GrammarChain):
            for part in sampler.parts():
                if part:
                    L.llama_sampler_free(part)
        elif sampler:
            if self.backend is not None and self.backend.retire(sampler):
                return  # still attached in llama.cpp, idle: the next request may take it
            L.llama_sampler_free(sampler.ptr)

    def accept(self, sampler: Any, token: int) -> None:
        """A token chosen without sampling (a forced one): the grammar and penalties see it
        as if it had been sampled."""
        if isinstance(sampler, GrammarChain):
            self.grammar.accept(sampler, token)
        else:
            L.llama_sampler_accept(sampler.ptr, token)

    def forced(self, sampler: Any, most: int) -> list[int]:
        """The tokens a request's grammar forces next ([] without a grammar)."""
        return self.grammar.forced(sampler, most) if isinstance(sampler, GrammarChain) else []

    def take_forced(self, sampler: Any, token: int) -> bool:
        return isinstance(sampler, GrammarChain) and self.grammar.take_forced(sampler, token)

    def sample(self, sampler: Any, batch_index: int) -> int:
        if isinstance(sampler, GrammarChain):
            return self.grammar.sample(sampler, batch_index)
        if sampler.live and self.backend is not None:
            picked = self.backend.token(batch_index)
            if picked >= 0:
                return picked
        if sampler.argmax and self._shortcuts:  # greedy keeps no state: nothing to accept
            return int(self.cand.row(batch_index).argmax())
        if sampler.top_k and self._shortcuts:
            token = self._sample_window(sampler, batch_index)
            if token is not None:
                return token
        sampler.full += 1
        return int(L.llama_sampler_sample(sampler.ptr, self.ctx, batch_index))

    def _sample_window(self, c: Chain, batch_index: int) -> int | None:
        """The chain run on the logits at or above ``c.floor`` (``Candidates.windowed``),
        when at least ``c.top_k`` are there: they include the k best, so top_k keeps the
        same k, and everything after it (top_p, min_p, temperature, dist) sees the same k.
        None: the caller samples the whole vocabulary."""
        cur = self.cand.windowed(self.cand.row(batch_index), c, c.top_k)
        if cur is None:
            return None
        L.llama_sampler_apply(c.ptr, ctypes.byref(cur))
        token = int(self.cand.window_ids[cur.selected])  # (samplers reorder in place)
        L.llama_sampler_accept(c.ptr, token)
        c.windowed += 1
        return token

"""Sampling inside llama.cpp (``model.backend_sampling``): a request's chain attached to its
sequence with ``llama_set_sampler``, so that llama.cpp runs top_k / top_p / min_p /
temperature / dist (or greedy) in the decode's own graph and hands back only the chosen
token (``llama_get_sampled_token_ith``). The logits never reach Python; in a step where
every output is so sampled, llama.cpp does not even copy them out of the device. That is
what a GPU wants; on a CPU the graph's top_k (a partial sort over the whole vocabulary) costs
more than the engine's own window (``engine.sampling.candidates``), so it is off by default.

Only chains that need nothing but the token qualify (``Chain.key`` set): no grammar, logit
bias, penalties or logprobs, and one output per sequence and step (no drafts, no prompt
logprobs). The engine makes such a request's chain before the decode that ends its prompt,
so its first token is sampled there too.

Each attach or detach makes llama.cpp rebuild the next decode's graph and re-reserve its
scheduler (milliseconds, more with many sequences), so a chain whose request ended stays
attached, idle: the next request on that sequence with the same sampling takes it over
(reset to its seed if the client chose that same seed; a drawn seed just continues the
stream). Idle chains cost almost nothing (their sequences have no output rows). Any other
request sampled after a decode of that sequence gets it replaced or detached first: llama.cpp
would otherwise sample that output itself and, in a step without Python-sampled outputs
elsewhere, not copy its logits at all.

llama.cpp keeps a raw pointer to every attached chain, so a chain is freed only once
detached. And a chain is attached once at most: llama.cpp initialises it for its graph once
and aborts the process at a second time, so a request whose chain was detached (its sequence
taken while it waited) samples in Python from then on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llama_cpp

if TYPE_CHECKING:
    from engine.sampling.samplers import Chain
    from engine.scheduler import BatchItem

L: Any = llama_cpp  # the C API, untyped (see engine.runner)


class BackendSampling:
    """Which chain is attached to which sequence of one context, and which are idle."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.attached: dict[int, Chain] = {}
        self.idle: set[int] = set()  # sequences whose attached chain's request has ended
        self.changes = 0  # llama_set_sampler calls (each re-reserves the scheduler)
        self.sampled = 0  # tokens llama.cpp sampled
        self.reused = 0  # idle chains a new request took over

    def reuse(self, key: tuple[object, ...], seed: int, seeded: bool, seq: int) -> Chain | None:
        """The idle chain attached to ``seq``, when it samples as ``key`` says (and, for a
        seed the client chose, from that seed: then reset to its start)."""
        chain = self.attached.get(seq)
        if chain is None or seq not in self.idle or chain.key != key:
            return None
        if seeded:
            if chain.seed != seed:
                return None
            L.llama_sampler_reset(chain.ptr)
        self.idle.discard(seq)
        chain.live, chain.floor = False, float("-inf")
        self.reused += 1
        return chain

    def retire(self, chain: Chain) -> bool:
        """Its request ended: True if it stays attached, idle (not to be freed now)."""
        if chain.seq is None or self.attached.get(chain.seq) is not chain:
            return False
        self.idle.add(chain.seq)
        chain.live = False
        return True

    def arrange(self, items: Sequence[BatchItem]) -> None:
        """Before a decode: each item that is sampled after it gets its chain attached to
        its sequence if the chain qualifies; any other item with output rows (prompt
        logprobs, drafts) gets nothing attached there. ``Chain.live`` says which way its
        token is read after the decode."""
        from engine.sampling.samplers import Chain

        for item in items:
            r = item.request
            if not (item.logits or item.n_draft or r.params.prompt_logprobs):
                continue  # no output row for this sequence in this decode
            chain = r.sampler if isinstance(r.sampler, Chain) else None
            want = chain if (chain is not None and chain.key is not None and item.logits
                             and not item.n_draft and not r.params.prompt_logprobs) else None
            seq = r.seq_id
            if want is not None and want.seq is not None and want.seq != seq:
                self._set(want.seq, None)  # it moved to another sequence: never attached again
                want = None
            if self.attached.get(seq) is not want and not self._set(seq, want):
                want = None  # llama.cpp cannot run it: sample in Python
            if chain is not None:
                chain.live = want is not None

    def token(self, batch_index: int) -> int:
        """The token llama.cpp sampled for output ``batch_index`` (negative: none)."""
        self.sampled += 1
        return int(L.llama_get_sampled_token_ith(self.ctx, batch_index))

    def close(self) -> None:
        for seq in list(self.attached):
            self._set(seq, None)

    def _set(self, seq: int, chain: Chain | None) -> bool:
        """Attach ``chain`` to ``seq`` (None: nothing); the chain it replaces can never be
        attached again, and is freed if it was idle."""
        self.changes += 1
        old = self.attached.pop(seq, None)
        ok = bool(L.llama_set_sampler(self.ctx, seq, chain.ptr if chain is not None else None))
        if old is not None:
            old.seq, old.live, old.key = None, False, None
            if seq in self.idle:
                self.idle.discard(seq)
                L.llama_sampler_free(old.ptr)
        if chain is None or not ok:
            if chain is not None:
                chain.key = None
                L.llama_set_sampler(self.ctx, seq, None)
            return chain is None
        self.attached[seq] = chain
        chain.seq = seq
        return True

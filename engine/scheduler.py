"""Continuous-batching scheduler: pure Python, no llama.cpp.

Each step it decides which sequences decode and how many prompt tokens each
prefills, within ``n_batch`` tokens. Running sequences that are generating
always get their one token first (streams never stall behind a long prompt);
the rest of the budget goes to chunked prefill, oldest first, then to waiting
requests admitted in FIFO order while sequence ids and KV cells are free.
Which sequence a request gets, and how much of its prompt is already computed
there, is the prefix cache's decision (``engine.prefix_cache``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.prefix_cache import PrefixCache
from engine.request import Request, Status


@dataclass(frozen=True)
class BatchItem:
    request: Request
    tokens: list[int]
    pos: int  # position of tokens[0] in the sequence
    logits: bool  # sample after this item (last chunk of prompt, or a decode token)
    n_draft: int = 0  # proposed tokens after the pending one (logits for every position)


@dataclass
class StepPlan:
    items: list[BatchItem] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # ended for lack of KV cells
    admitted: list[Request] = field(default_factory=list)  # left the waiting queue this step

    @property
    def num_tokens(self) -> int:
        return sum(len(i.tokens) for i in self.items)


class Scheduler:
    def __init__(self, cache: PrefixCache, n_batch: int) -> None:
        self.cache = cache
        self.n_batch = n_batch
        self.kv_capacity = cache.capacity
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # -- queue management -------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def remove(self, request: Request, keep_kv: bool = True) -> None:
        """Take a request out (finished, cancelled or failed); its sequence is free again
        and keeps its KV as cache unless ``keep_kv`` is False."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.cache.release(request, keep_kv)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.status = Status.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def seqs_in_use(self) -> int:
        return len(self.running)

    # -- planning -----------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan(preempted=self._preempt())
        budget = self.n_batch
        decoding = [r for r in self.running if r.prefill_done]
        budget -= len(decoding)
        room = 0
        if any(r.draft for r in decoding):  # the ledger is only walked when someone drafts
            room = (self.kv_capacity - self.cache.cells_used() - self._pending_prefill()
                    - len(decoding))
        for r in decoding:  # drafts ride along while the batch and the KV have room
            draft = r.draft[:max(0, min(budget, room))] if r.draft else []
            budget -= len(draft)
            room -= len(draft)
            plan.items.append(BatchItem(r, [*r.next_tokens(1), *draft], r.num_computed, True,
                                        len(draft)))
        for r in self.running:
            if budget <= 0:
                break
            if not r.prefill_done:
                budget -= self._add_prefill(plan, r, budget)
        while budget > 0 and self.waiting:
            head = self.waiting[0]
            if not self.cache.admit(head, self._pending_prefill() + len(self.running)):
                break  # no free sequence or KV cells yet (or its prefix is being computed)
            self.waiting.popleft()
            head.status = Status.RUNNING
            plan.admitted.append(head)
            self.running.append(head)
            budget -= self._add_prefill(plan, head, budget)
        return plan

    def _add_prefill(self, plan: StepPlan, r: Request, budget: int) -> int:
        tokens = r.next_tokens(budget)
        last = r.num_computed + len(tokens) >= len(r.prompt)
        plan.items.append(BatchItem(r, tokens, r.num_computed, last))
        return len(tokens)

    def _pending_prefill(self) -> int:
        return sum(len(r.prompt) - r.num_computed for r in self.running if not r.prefill_done)

    def _preempt(self) -> list[Request]:
        """While the KV cache cannot grow by one cell for every generating sequence, drop
        cached sequences (least recently used first), then end the youngest generating
        sequences; the caller reports them finished with reason "length"."""
        ended: list[Request] = []
        decoding = [r for r in self.running if r.prefill_done]
        while decoding and (self.cache.cells_used() + self._pending_prefill() + len(decoding)
                            > self.kv_capacity):
            if self.cache.evict_lru():
                continue
            youngest = max(decoding, key=lambda r: r.id)
            decoding.remove(youngest)
            self.remove(youngest, keep_kv=False)
            youngest.finish_reason = "length"
            ended.append(youngest)
        return ended

    # -- results ------------------------------------------------------------
    def commit(self, plan: StepPlan) -> None:
        """Account for a successful decode of the plan: its tokens are in the KV cache."""
        for item in plan.items:
            item.request.num_computed += len(item.tokens)
            self.cache.committed(item.request, item.tokens)

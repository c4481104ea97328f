"""Continuous-batching scheduler: pure Python, no llama.cpp.

Each step it decides which sequences decode and how many prompt tokens each
prefills, within ``n_batch`` tokens. Running sequences that are generating
always get their one token first (streams never stall behind a long prompt);
the rest of the budget goes to chunked prefill, oldest first, then to waiting
requests admitted in FIFO order while sequence ids and KV cells are free.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.request import Request, Status


@dataclass(frozen=True)
class BatchItem:
    request: Request
    tokens: list[int]
    pos: int  # position of tokens[0] in the sequence
    logits: bool  # sample after this item (last chunk of prompt, or a decode token)


@dataclass
class StepPlan:
    items: list[BatchItem] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # ended for lack of KV cells

    @property
    def num_tokens(self) -> int:
        return sum(len(i.tokens) for i in self.items)


class Scheduler:
    def __init__(self, n_seq_max: int, n_batch: int, kv_capacity: int) -> None:
        self.n_batch = n_batch
        self.kv_capacity = kv_capacity
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_seqs: list[int] = list(range(n_seq_max - 1, -1, -1))

    # -- queue management -------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out (finished, cancelled or failed); its seq id is free again."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self._free_seqs.append(request.seq_id)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.status = Status.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def seqs_in_use(self) -> int:
        return len(self.running)

    def kv_used(self) -> int:
        return sum(r.num_computed for r in self.running)

    # -- planning -----------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan(preempted=self._preempt())
        budget = self.n_batch
        for r in self.running:
            if r.prefill_done:
                plan.items.append(BatchItem(r, r.next_tokens(1), r.num_computed, True))
                budget -= 1
        for r in self.running:
            if budget <= 0:
                break
            if not r.prefill_done:
                budget -= self._add_prefill(plan, r, budget)
        while budget > 0 and self.waiting and self._free_seqs:
            head = self.waiting[0]
            reserved = self.kv_used() + self._pending_prefill() + len(self.running)
            if reserved + len(head.prompt) + 1 > self.kv_capacity:
                break  # wait until running sequences free KV cells
            self.waiting.popleft()
            head.seq_id = self._free_seqs.pop()
            head.status = Status.RUNNING
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
        """End the youngest generating sequences while the KV cache cannot grow by one
        cell for every generating sequence. The caller clears their KV and reports
        them finished with reason "length"."""
        ended: list[Request] = []
        decoding = [r for r in self.running if r.prefill_done]
        used = self.kv_used() + self._pending_prefill()
        while decoding and used + len(decoding) > self.kv_capacity:
            youngest = max(decoding, key=lambda r: r.id)
            decoding.remove(youngest)
            used -= youngest.num_computed
            self.remove(youngest)
            youngest.finish_reason = "length"
            ended.append(youngest)
        return ended

    # -- results ------------------------------------------------------------
    def commit(self, plan: StepPlan) -> None:
        """Account for a successful decode of the plan: its tokens are in the KV cache."""
        for item in plan.items:
            item.request.num_computed += len(item.tokens)

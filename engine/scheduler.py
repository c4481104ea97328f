"""Continuous-batching scheduler: pure Python, no llama.cpp.

Each step it decides which sequences decode and how many prompt tokens each
prefills, within ``n_batch`` tokens. Running sequences that are generating
always get their one token first (streams never stall behind a long prompt);
the rest of the budget goes to chunked prefill, oldest first, then to waiting
requests admitted in FIFO order while sequence ids and KV cells are free.
Which sequence a request gets, and how much of its prompt is already computed
there, is the prefix cache's decision (``engine.caches.prefix_cache``). On recurrent / hybrid
models a prefill chunk ends exactly at each of the request's ``snapshot_at`` positions
(chosen by the prefix cache), which snapshots the state after that decode.

LoRA adapters apply to the whole llama context, so a step serves one adapter set: when
requests with different sets are running, steps take turns between the sets (round
robin), and the waiting queue's head is admitted on its set's turn (FIFO is kept).

Batch lines run at background priority: waiting interactive requests are admitted first,
take a line's sequence when none is free (``Request.suspend``), and prefill whole, not in
the chunks that keep other streams' inter-token latency short (a batch line has no reader
waiting for its next token).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.caches.prefix_cache import PrefixCache
from engine.request import Request, Status
from engine.step_budget import StepBudget


@dataclass(slots=True)  # (not frozen: a frozen dataclass costs 7x as much to make, per token)
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
    suspended: list[Request] = field(default_factory=list)  # gave their sequence up, waiting
    admitted: list[Request] = field(default_factory=list)  # left the waiting queue this step
    adapters: tuple[tuple[str, float], ...] = ()  # the LoRA set every item runs under

    @property
    def num_tokens(self) -> int:
        return sum(len(i.tokens) for i in self.items)


class Scheduler:
    def __init__(self, cache: PrefixCache, n_batch: int, prefill_chunk: int = 0,
                 step_budget: StepBudget | None = None) -> None:
        self.cache = cache
        self.n_batch = n_batch
        # prompt tokens per step while others generate (their inter-token latency): from
        # measured step costs with a step budget, at most prefill_chunk
        self.prefill_chunk = prefill_chunk or n_batch
        self.step_budget = step_budget
        self.kv_capacity = cache.capacity
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._last_set: tuple[tuple[str, float], ...] | None = None

    # -- queue management -------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request: FIFO within a priority, lower ``priority`` admitted first
        (an interactive request goes ahead of waiting batch lines)."""
        request.status = Status.WAITING
        at = len(self.waiting)
        while at and self.waiting[at - 1].priority > request.priority:
            at -= 1
        self.waiting.insert(at, request)

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
    def _adapter_turn(self) -> tuple[tuple[str, float], ...]:
        """The adapter set this step serves: the next one after the last served, among
        the running requests' sets and the waiting head's."""
        sets = {r.adapters for r in self.running}
        if self.waiting:
            sets.add(self.waiting[0].adapters)
        if len(sets) <= 1:
            return next(iter(sets), ())
        order = sorted(sets)
        last = self._last_set
        return next((a for a in order if last is not None and a > last), order[0])

    def schedule(self) -> StepPlan:
        if not self.waiting:
            plan = self._decode_only()
            if plan is not None:
                return plan
        plan = StepPlan(preempted=self._preempt(), suspended=self._yield_sequences())
        turn = plan.adapters = self._last_set = self._adapter_turn()
        budget = self.n_batch
        decoding = [r for r in self.running if r.prefill_done and r.adapters == turn]
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
        if any(i.request.priority == 0 for i in plan.items):  # (batch lines' ITL: no matter)
            budget = min(budget, self.prefill_chunk if self.step_budget is None else
                         min(self.prefill_chunk,
                             self.step_budget.prefill_tokens(plan.num_tokens)))
        for r in self.running:
            if budget <= 0:
                break
            if not r.prefill_done and r.adapters == turn:
                budget -= self._add_prefill(plan, r, budget)
        while budget > 0 and self.waiting:
            head = self.waiting[0]
            if head.adapters != turn:
                break  # FIFO: it is admitted on its adapter set's turn
            if not self.cache.admit(head, self._pending_prefill() + len(self.running)):
                break  # no free sequence or KV cells yet (or its prefix is being computed)
            self.waiting.popleft()
            head.status = Status.RUNNING
            plan.admitted.append(head)
            self.running.append(head)
            budget -= self._add_prefill(plan, head, budget)
        return plan

    def _decode_only(self) -> StepPlan | None:
        """Most steps, planned in one pass (None: plan it the general way): nothing waits,
        every running sequence has its prompt in and no draft, they share one adapter set,
        and the KV cache has a cell for each. The plan is the general path's."""
        running = self.running
        if not running:
            return None
        adapters = running[0].adapters
        for r in running:
            if r.draft or r.adapters != adapters or r.num_computed < len(r.prompt):
                return None
        if self.cache.cells_bound() + len(running) > self.kv_capacity:
            return None  # _preempt decides
        self._last_set = adapters
        plan = StepPlan(items=[BatchItem(r, [r.output[-1]], r.num_computed, True)
                               for r in running], adapters=adapters)
        if self.step_budget is not None and any(r.priority == 0 for r in running):
            self.step_budget.prefill_tokens(len(running))  # as the general path: it grows
        return plan

    def _add_prefill(self, plan: StepPlan, r: Request, budget: int) -> int:
        if r.pending_media is not None:
            return 0  # its media is encoded before a later step (Engine._encode_media)
        # a chunk ends where the prefix cache snapshots the recurrent state
        stop = next((p for p in r.snapshot_at if p > r.num_computed), 0)
        if stop:
            budget = min(budget, stop - r.num_computed)
        tokens = r.next_tokens(budget)
        if r.media and not r.next_tokens_fit(tokens):
            return 0  # a media evaluated whole waits for a step with room for all of it
        last = r.num_computed + len(tokens) >= len(r.prompt)
        plan.items.append(BatchItem(r, tokens, r.num_computed, last))
        return len(tokens)

    def _yield_sequences(self) -> list[Request]:
        """Interactive requests do not wait for batch lines to finish: while more of them
        wait than sequences are free, running background requests give theirs up
        (``Request.suspend``), those with the least computed first, and wait again, first
        among the background ones. Their KV stays as cache while nobody takes the
        sequence (or on disk); once it is taken, coming back re-evaluates prompt + output
        in one prefill, as vLLM's recompute preemption does."""
        urgent = 0
        while urgent < len(self.waiting) and self.waiting[urgent].priority == 0:
            urgent += 1
        need = urgent - (len(self.cache.slots) - len(self.running))
        if need <= 0:
            return []
        victims = sorted((r for r in self.running if r.priority > 0 and _suspendable(r)),
                         key=lambda r: (r.num_computed, -r.id))[:need]
        for r in sorted(victims, key=lambda r: -r.id):  # the oldest ends up first in line
            self.running.remove(r)
            self.cache.release(r, keep=True)
            r.suspend()
            r.status = Status.WAITING
            at = 0
            while at < len(self.waiting) and self.waiting[at].priority < r.priority:
                at += 1
            self.waiting.insert(at, r)
        return victims

    def _pending_prefill(self) -> int:
        return sum(len(r.prompt) - r.num_computed for r in self.running if not r.prefill_done)

    def _preempt(self) -> list[Request]:
        """While the KV cache cannot grow by one cell for every generating sequence, drop
        cached sequences (least recently used first), then end the youngest generating
        sequences; the caller reports them finished with reason "length"."""
        ended: list[Request] = []
        decoding = [r for r in self.running if r.prefill_done]
        if not decoding or (self.cache.cells_bound() + self._pending_prefill() + len(decoding)
                            <= self.kv_capacity):
            return ended  # (the bound is exact but for shared cells: most steps end here)
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


def _suspendable(r: Request) -> bool:
    """Whether ``r`` can give its sequence up and come back through the prefix cache as if
    nothing happened (media spans and prompt logprobs are not re-evaluated that way)."""
    return (r.params.cache_prompt and not r.params.prompt_logprobs and not r.media
            and not r.cancelled)

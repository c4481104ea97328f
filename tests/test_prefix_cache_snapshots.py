"""Recurrent-state snapshots (``engine.caches.snapshots``) in the prefix cache, against the
fake KV's recurrent mode: a prompt sharing only part of a cached sequence resumes from the
furthest snapshot within the shared part, never from a state that read other tokens."""

from __future__ import annotations

from pathlib import Path

from test_prefix_cache import req, run_to_end, step
from test_prefix_cache_recurrent import check_in_sync

from engine.caches.disk_cache import DiskCache
from engine.caches.prefix_cache import PrefixCache
from engine.config import DiskCacheConfig
from engine.metrics import EngineMetrics
from engine.scheduler import Scheduler
from fake_kv import FakeKv

EOT = 2  # the fake KV's end-of-generation token (ends a chat message)
SYS = [*range(100, 900), EOT]  # a system prompt of 801 tokens, up to and with its EOT
HEAD = [5, 6]  # "<|im_start|>assistant\n"


def user(start: int, n: int = 600) -> list[int]:
    return [*range(start, start + n), EOT]


def snapshotting(snapshot_bytes: int = 1 << 20, n_batch: int = 4096, n_seq: int = 4,
                 disk: DiskCache | None = None, **kv_args: object
                 ) -> tuple[Scheduler, FakeKv, EngineMetrics]:
    kv = FakeKv(recurrent=True, **kv_args)  # type: ignore[arg-type]
    metrics = EngineMetrics()
    cache = PrefixCache(n_seq, kv, capacity=20_000, disk=disk, metrics=metrics,
                        snapshot_bytes=snapshot_bytes, is_eog=kv.is_eog)
    return Scheduler(cache, n_batch), kv, metrics


def value(metrics: EngineMetrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return got or 0.0


def test_prefill_chunks_end_at_message_ends_and_before_the_last_token() -> None:
    s, kv, metrics = snapshotting(n_batch=512)
    prompt = [*SYS, *user(1000), *HEAD]  # 801 + 601 + 2
    a = req(prompt)
    s.add(a)
    sizes = [len(step(s, kv).items[0].tokens) for _ in range(4)]
    # after the system prompt's EOT (801), one token before the end (1,403); the user
    # message's EOT (1,402) is too close to the end to be worth a snapshot of its own
    assert a.snapshot_at == [801, len(prompt) - 1]
    assert sizes == [512, 289, 512, 90]
    assert s.cache.snaps.positions(a.seq_id) == [801, len(prompt) - 1]
    assert value(metrics, "llamaserve_state_snapshots_taken_total") == 2
    assert value(metrics, "llamaserve_state_snapshot_bytes") == s.cache.snaps.bytes > 0
    check_in_sync(s, kv)


def test_a_second_conversation_resumes_after_the_system_prompt() -> None:
    s, kv, metrics = snapshotting()
    first = [*SYS, *user(1000), *HEAD]
    a = req(first)
    run_to_end(s, kv, a)
    b = req([*SYS, *user(3000, 50), *HEAD])  # the same system prompt, another question
    s.add(b)
    plan = step(s, kv)
    assert b.cached_tokens == len(SYS) and plan.items[0].pos == len(SYS)
    # copied into another sequence: the first conversation stays whole for its next turn
    assert b.seq_id != a.seq_id and kv.rewinds == [(b.seq_id, len(SYS), a.seq_id)]
    assert value(metrics, "llamaserve_state_snapshots_restored_total", source="memory") == 1
    assert value(metrics, "llamaserve_state_snapshot_tokens_reused_total") == len(SYS)
    run_to_end(s, kv, b)
    check_in_sync(s, kv)
    nxt = req([*s.cache.slots[a.seq_id].tokens, EOT, *user(4000, 20), *HEAD])
    s.add(nxt)
    step(s, kv)
    assert nxt.seq_id == a.seq_id and nxt.cached_tokens == len(first) + 2  # whole
    check_in_sync(s, kv)


def test_a_system_prompt_inside_the_first_turn_is_a_snapshot_point_too() -> None:
    """Gemma's template folds the system prompt into the first user turn: no end token
    follows it, so the API marks where its text ends (``Request.message_ends``)."""
    s, kv, metrics = snapshotting()
    system = [*range(100, 900)]  # no EOT after it
    a = req([*system, *user(1000), *HEAD])
    a.message_ends = (len(system),)
    run_to_end(s, kv, a)
    assert len(system) in s.cache.snaps.positions(a.seq_id)
    b = req([*system, *user(3000, 50), *HEAD])  # the same system prompt, another question
    b.message_ends = (len(system),)
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == len(system)  # resumed from the snapshot, not evaluated again
    assert value(metrics, "llamaserve_state_snapshots_restored_total", source="memory") == 1
    check_in_sync(s, kv)


def test_a_busy_sequence_serves_its_snapshot_by_copy() -> None:
    s, kv, _ = snapshotting(n_batch=1024)
    a = req([*SYS, *user(1000), *HEAD])
    s.add(a)
    step(s, kv)  # 801 tokens: the system prompt, snapshot taken
    step(s, kv)  # the rest of the prompt, first token sampled: a is generating
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == len(SYS) and kv.rewinds == [(b.seq_id, len(SYS), a.seq_id)]
    while not b.output:
        step(s, kv)
    check_in_sync(s, kv)


def test_a_retried_last_turn_resumes_after_the_previous_message() -> None:
    s, kv, _ = snapshotting()
    t1 = [*SYS, *user(1000), *HEAD]
    a = req(t1)
    run_to_end(s, kv, a)
    answer = s.cache.slots[a.seq_id].tokens[len(t1):]
    history = [*t1, *answer, EOT, 9]  # the answer, closed: an agent's transcript so far
    t2 = req([*history, *user(5000, 200), *HEAD])
    run_to_end(s, kv, t2)
    assert t2.cached_tokens == len(t1) + len(answer)  # the first turn, whole
    retry = req([*history, *user(6000, 180), *HEAD])  # the last user message, edited
    s.add(retry)
    plan = step(s, kv)
    boundary = len(t1) + len(answer) + 1  # right after the answer's EOT
    assert retry.cached_tokens == boundary and plan.items[0].pos == boundary
    assert retry.seq_id == a.seq_id and kv.rewinds == [(a.seq_id, boundary, None)]  # in place
    while not retry.output:
        step(s, kv)
    check_in_sync(s, kv)


def test_an_identical_prompt_evaluates_only_its_last_token() -> None:
    s, kv, _ = snapshotting()
    prompt = [*SYS, *user(1000), *HEAD]
    a = req(prompt)
    run_to_end(s, kv, a)
    again = req(prompt)
    s.add(again)
    plan = step(s, kv)
    assert again.cached_tokens == len(prompt) - 1
    assert plan.items[0].tokens == prompt[-1:] and plan.items[0].logits
    check_in_sync(s, kv)


def test_a_snapshot_llama_cpp_refuses_is_dropped_and_the_prompt_evaluated() -> None:
    s, kv, metrics = snapshotting(rewind_fails=True)
    a = req([*SYS, *user(1000), *HEAD])
    run_to_end(s, kv, a)
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    assert value(metrics, "llamaserve_state_snapshots_failed_total") == 1
    assert len(SYS) not in s.cache.snaps.positions(a.seq_id)
    while not b.output:
        step(s, kv)
    check_in_sync(s, kv)


def test_a_snapshot_at_another_position_is_refused() -> None:
    s, kv, _ = snapshotting()
    a = req([*SYS, *user(1000), *HEAD])
    run_to_end(s, kv, a)
    snap = s.cache.snaps.get(a.seq_id, len(SYS))
    assert snap is not None
    snap.data = s.cache.snaps.get(a.seq_id, len(a.prompt) - 1).data  # type: ignore[union-attr]
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    while not b.output:
        step(s, kv)
    check_in_sync(s, kv)


def test_snapshot_memory_is_bounded_least_recently_used_first() -> None:
    size = len(FakeKv(recurrent=True).state_get_partial(0))
    s, kv, metrics = snapshotting(snapshot_bytes=3 * size + 10)
    for i in range(3):  # three conversations, two snapshots each (the system prompt's shared)
        run_to_end(s, kv, req([*SYS, *user(1000 + 1000 * i), *HEAD]))
    assert s.cache.snaps.bytes <= 3 * size + 10 and len(s.cache.snaps) == 3
    assert value(metrics, "llamaserve_state_snapshots_evicted_total") > 0
    check_in_sync(s, kv)


def test_evicting_a_sequence_drops_its_snapshots() -> None:
    s, kv, _ = snapshotting(n_seq=1)
    run_to_end(s, kv, req([*SYS, *user(1000), *HEAD]))
    run_to_end(s, kv, req(list(range(7000, 7100))))  # another prompt takes the only sequence
    assert s.cache.snaps.bytes == 0 or all(
        p <= len(s.cache.slots[0].tokens) for p in s.cache.snaps.positions(0))
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    check_in_sync(s, kv)


def test_off_without_a_budget() -> None:
    s, kv, _ = snapshotting(snapshot_bytes=0)
    run_to_end(s, kv, req([*SYS, *user(1000), *HEAD]))
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0 and not b.snapshot_at and not kv.rewinds


def test_snapshots_are_saved_with_disk_entries_and_resume_after_a_restart(
        tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 22, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv, _ = snapshotting(disk=disk)
    first = [*SYS, *user(1000), *HEAD]
    run_to_end(s, kv, req(first))
    assert disk.flush()
    disk.close()
    stored = {len(disk._tree.tokens(k)): disk.snapshot_positions(k) for k in disk._entries}
    assert stored[len(first)] == (len(SYS), len(first) - 1)

    for prompt, reused in (([*SYS, *user(3000, 50), *HEAD], len(SYS)),  # another question
                           (first, len(first) - 1)):  # the same prompt again
        restarted = DiskCache(cfg, key="k")
        s2, kv2, metrics = snapshotting(disk=restarted)
        r = req(prompt)
        s2.add(r)
        step(s2, kv2)
        assert r.cached_tokens == reused
        assert value(metrics, "llamaserve_state_snapshots_restored_total", source="disk") == 1
        while not r.output:
            step(s2, kv2)
        check_in_sync(s2, kv2)
        restarted.close()


def test_a_damaged_snapshot_table_is_a_corrupt_file(tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 22, min_tokens=4)
    d = DiskCache(cfg, key="k")
    d.put([1, 2, 3, 4, 5, 6], bytearray(b"state"), ((3, b"snap3"),))
    assert d.flush()
    (name,) = d._entries
    assert d.read_entry(name, [1, 2, 3, 4, 5, 6]) == (bytearray(b"state"), {3: b"snap3"})
    d.close()
    path = tmp_path / name
    path.write_bytes(path.read_bytes()[:-2])  # truncated inside the snapshot
    again = DiskCache(cfg, key="k")
    assert len(again) == 0 and not path.exists()
    again.close()

"""Sliding-window snapshots (``swa_full: false``) in the prefix cache, against the fake KV's
window mode: the window layers keep the last 100 positions, so a prompt sharing a prefix
that ends further back than that resumes from the furthest snapshot of the window within
the shared part (``engine.caches.snapshot_paths``), never from a window that lost
positions it attends to."""

from __future__ import annotations

from pathlib import Path

from test_prefix_cache import req, run_to_end, step
from test_prefix_cache_snapshots import EOT, HEAD, SYS, user, value

from engine.caches.disk_cache import DiskCache
from engine.caches.prefix_cache import PrefixCache
from engine.config import DiskCacheConfig
from engine.metrics import EngineMetrics
from engine.scheduler import Scheduler
from fake_kv import FakeKv

WINDOW = 100


def windowed(snapshot_bytes: int = 1 << 20, n_seq: int = 4, disk: DiskCache | None = None,
             **kv_args: object) -> tuple[Scheduler, FakeKv, EngineMetrics]:
    kv = FakeKv(n_swa_window=WINDOW, **kv_args)  # type: ignore[arg-type]
    metrics = EngineMetrics()
    cache = PrefixCache(n_seq, kv, capacity=20_000, n_swa=WINDOW, disk=disk, metrics=metrics,
                        snapshot_bytes=snapshot_bytes, is_eog=kv.is_eog)
    return Scheduler(cache, 4096), kv, metrics


def check_in_sync(s: Scheduler, kv: FakeKv) -> None:
    """Every sequence holds what the cache believes, and no decode ever attended to a
    window with positions missing."""
    assert not kv.wrong
    for slot in s.cache.slots:
        assert kv.held(slot.seq_id) == len(slot.tokens), slot


def finish(s: Scheduler, kv: FakeKv, *requests: object) -> None:
    while not all(r.output for r in requests):  # type: ignore[attr-defined]
        step(s, kv)
    check_in_sync(s, kv)


def test_a_branch_beyond_the_window_resumes_from_the_snapshot() -> None:
    s, kv, metrics = windowed()
    first = [*SYS, *user(1000), *HEAD]  # 801 + 601 + 2: the system prompt ends 603 back
    a = req(first)
    run_to_end(s, kv, a)
    assert s.cache.snaps.positions(a.seq_id) == [len(SYS), len(first) - 1]
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    plan = step(s, kv)
    assert b.cached_tokens == len(SYS) and plan.items[0].pos == len(SYS)
    assert kv.rewinds == [(b.seq_id, len(SYS), a.seq_id)]  # by copy: a stays whole
    assert value(metrics, "llamaserve_state_snapshots_restored_total", source="memory") == 1
    finish(s, kv, b)
    nxt = req([*s.cache.slots[a.seq_id].tokens, EOT, *user(4000, 20), *HEAD])
    s.add(nxt)
    step(s, kv)
    assert nxt.seq_id == a.seq_id and nxt.cached_tokens == len(first) + 2  # whole, no snapshot
    finish(s, kv, nxt)


def test_without_snapshots_the_branch_is_evaluated() -> None:
    s, kv, _ = windowed(snapshot_bytes=0)
    run_to_end(s, kv, req([*SYS, *user(1000), *HEAD]))
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0 and not kv.rewinds and not b.snapshot_at


def test_the_divergence_point_serves_the_next_prompt_sharing_it() -> None:
    s, kv, _ = windowed()
    long = list(range(10_000, 11_500))  # no message ends: raw text
    run_to_end(s, kv, req(long))
    b = req([*long[:700], *range(20_000, 20_050)])  # 800 back: nothing to resume from
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0 and 700 in b.snapshot_at
    finish(s, kv, b)
    c = req([*long[:700], *range(30_000, 30_050)])
    s.add(c)
    step(s, kv)
    assert c.cached_tokens == 700 and kv.rewinds[-1][1] == 700
    finish(s, kv, c)


def test_a_retried_tail_resumes_in_place() -> None:
    s, kv, _ = windowed(n_seq=1)
    t1 = [*SYS, *user(1000, 300), *HEAD]
    run_to_end(s, kv, req(t1))
    retry = req([*SYS, *user(1000, 150), *user(9000, 20), *HEAD])  # the last message edited
    s.add(retry)
    step(s, kv)
    assert retry.cached_tokens == len(SYS) and kv.rewinds == [(0, len(SYS), None)]
    finish(s, kv, retry)


def test_a_restored_window_that_does_not_reach_back_is_dropped() -> None:
    s, kv, metrics = windowed()
    a = req([*SYS, *user(1000), *HEAD])
    run_to_end(s, kv, a)
    snap = s.cache.snaps.get(a.seq_id, len(SYS))
    assert snap is not None
    # the window's last position is right, but it starts 10 too late: llama.cpp would take
    # it, the next decode would attend to positions that are not there
    snap.data = snap.data.replace(b"[700, ", b"[").replace(b"[701, ", b"[", 1)
    for p in range(702, 711):
        snap.data = snap.data.replace(f"{p}, ".encode(), b"", 1)
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    assert kv.rewinds == [(b.seq_id, len(SYS), a.seq_id)]  # taken, then refused by the check
    assert value(metrics, "llamaserve_state_snapshots_failed_total") == 1
    assert len(SYS) not in s.cache.snaps.positions(a.seq_id)
    finish(s, kv, b)


def test_a_snapshot_llama_cpp_refuses_is_dropped() -> None:
    s, kv, metrics = windowed(rewind_fails=True)
    run_to_end(s, kv, req([*SYS, *user(1000), *HEAD]))
    b = req([*SYS, *user(3000, 50), *HEAD])
    s.add(b)
    step(s, kv)
    assert b.cached_tokens == 0
    assert value(metrics, "llamaserve_state_snapshots_failed_total") == 1
    finish(s, kv, b)


def test_window_snapshots_are_saved_with_disk_entries(tmp_path: Path) -> None:
    cfg = DiskCacheConfig(path=str(tmp_path), max_bytes=1 << 22, min_tokens=64)
    disk = DiskCache(cfg, key="k")
    s, kv, _ = windowed(disk=disk)
    first = [*SYS, *user(1000), *HEAD]
    run_to_end(s, kv, req(first))
    assert disk.flush()
    disk.close()
    for prompt, reused in (([*SYS, *user(3000, 50), *HEAD], len(SYS)),  # another question
                           (first, len(first) - 1),  # the same prompt again
                           ([*first, 7, 7, 7, 5], len(first))):  # an append: loaded whole
        restarted = DiskCache(cfg, key="k")
        s2, kv2, metrics = windowed(disk=restarted)
        r = req(prompt)
        s2.add(r)
        step(s2, kv2)
        assert r.cached_tokens == reused, prompt[-5:]
        restored = value(metrics, "llamaserve_state_snapshots_restored_total", source="disk")
        assert restored == (reused < len(first))
        finish(s2, kv2, r)
        restarted.close()

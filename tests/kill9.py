"""kill -9 of a server while its disk cache is writing, in rounds; shared by
tests/test_disk_faults.py (a few rounds) and bench/kill9.py (20+).

Each round starts the server on the same cache directory, checks that it is healthy, that
the cache is within max_bytes, that no temp file survived the start and that a greedy
answer served from the cache equals the reference, then fires requests with long
distinct prompts (each one saved by the background writer) and kills the process with
SIGKILL: odd rounds at a random moment, even rounds as soon as a temp file appears."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from conftest import gemma_config, start_server

MAX_BYTES = 6 << 20  # a few entries: eviction runs too
WORDS = ["river", "stone", "lamp", "garden", "window", "paper", "silver", "orange", "forest",
         "candle", "bridge", "market", "winter", "harbor", "violin", "meadow"]


def prompt(i: int) -> str:
    rng = random.Random(i)
    return f"Record {i}. " + " ".join(rng.choice(WORDS) for _ in range(150)) + "\nSummary:"


REFERENCE = prompt(10_000)


@dataclass
class Report:
    rounds: int = 0
    started: int = 0  # restarts that became healthy
    mid_write: int = 0  # kills that left a partial temp file behind (killed mid-write)
    max_seen_bytes: int = 0  # largest cache total observed (files on disk and metric)
    rejected: float = 0.0  # files the server found corrupt at start and deleted
    mismatches: int = 0  # reference answers that differed from the first one
    disk_hits: int = 0  # restarts whose reference answer reused a prefix from the disk
    problems: list[str] = field(default_factory=list)


def _dir_bytes(path: Path) -> tuple[int, int]:
    total = temps = 0
    for p in path.iterdir():
        if p.name.startswith(".tmp-"):
            temps += 1
        else:
            total += p.stat().st_size
    return total, temps


def run(rounds: int, tmp: Path, seed: int = 0, max_wait: float = 1.5) -> Report:
    rng = random.Random(seed)
    cache_dir = tmp / "cache"
    cfg: dict[str, Any] = gemma_config(n_seq_max=4, max_output_tokens=16)
    cfg["disk_cache"] = {"path": str(cache_dir), "max_bytes": MAX_BYTES, "min_tokens": 32}
    report = Report()
    references: dict[bool, str] = {}
    for rnd in range(rounds + 1):  # the last start only checks
        server = start_server(cfg, tmp)
        report.started += 1
        try:
            url = server.base_url + "/completions"
            m = server.metrics()
            report.rejected = m.get("llamaserve_disk_cache_rejected_total{reason=corrupt}", 0.0)
            on_disk, temps = _dir_bytes(cache_dir)
            report.max_seen_bytes = max(report.max_seen_bytes, on_disk,
                                        int(m["llamaserve_disk_cache_bytes"]))
            if temps:
                report.problems.append(f"round {rnd}: {temps} temp file(s) after start")
            if m["llamaserve_disk_cache_bytes"] > MAX_BYTES or on_disk > MAX_BYTES:
                report.problems.append(f"round {rnd}: cache over max_bytes ({on_disk})")
            for _ in range(2 if rnd == 0 else 1):  # round 0: computed, then from memory
                r = httpx.post(url, json={"prompt": REFERENCE, "max_tokens": 8,
                                          "temperature": 0}, timeout=120)
                if r.status_code != 200:
                    report.problems.append(f"round {rnd}: reference got {r.status_code}")
                    continue
                # a reused prefix evaluates 1 token where a fresh prompt evaluates all:
                # different batch shapes can flip a near-tie, so compare like with like
                reused = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
                text = r.json()["choices"][0]["text"]
                if reused:
                    report.disk_hits += rnd > 0
                if reused not in references:
                    references[reused] = text
                elif text != references[reused]:
                    report.mismatches += 1
                    report.problems.append(f"round {rnd}: {text!r} != {references[reused]!r}")
            if rnd == rounds:
                break

            def fire(i: int, url: str = url) -> None:
                with contextlib.suppress(httpx.HTTPError):  # killed under it
                    httpx.post(url, json={"prompt": prompt(i), "max_tokens": 4,
                                          "temperature": 0}, timeout=60)

            threads = [threading.Thread(target=fire, args=(rng.randrange(40),), daemon=True)
                       for _ in range(4)]
            for t in threads:
                t.start()
            if rnd % 2:  # at a random moment
                time.sleep(rng.uniform(0.05, max_wait))
            else:  # as soon as a temp file shows up: inside a write
                end = time.monotonic() + max_wait * 4
                while time.monotonic() < end and not any(
                        p.name.startswith(".tmp-") for p in cache_dir.iterdir()):
                    time.sleep(0.0005)
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
            report.rounds += 1
            on_disk, temps = _dir_bytes(cache_dir)
            report.mid_write += temps > 0  # a partial file was left behind: killed mid-write
            report.max_seen_bytes = max(report.max_seen_bytes, on_disk)
            if on_disk > MAX_BYTES:
                report.problems.append(f"round {rnd}: {on_disk} bytes after the kill")
        finally:
            server.stop()
    return report

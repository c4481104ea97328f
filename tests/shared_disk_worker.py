"""One process of the shared disk-cache test (tests/test_disk_cache_shared.py).

Usage: ``python tests/shared_disk_worker.py DIR WORKER_ID SECONDS MAX_BYTES``. Saves
entries whose state bytes are derived from their tokens, and reads entries any worker
may have saved (token pool shared by all), checking each read byte for byte. Prints a
JSON summary; exits 1 on a mismatch or an exception.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.caches.disk_cache import DiskCache
from engine.config import DiskCacheConfig

WORKERS = 4
PER_WORKER = 12  # distinct sequences each worker saves, again and again


def sequence(worker: int, i: int) -> list[int]:
    """Worker ``worker``'s i-th sequence: its first token says who wrote it."""
    return [1000 + worker, i, *list(range(7 * i, 7 * i + 6 + i % 5 * 4))]


def state_for(tokens: list[int]) -> bytearray:
    """State bytes that can only belong to these tokens (200..1400 bytes)."""
    seed = hashlib.sha256(repr(tokens).encode()).digest()
    return bytearray((seed * 50)[: 200 + (tokens[1] % 7) * 200])


def main() -> int:
    path, me, seconds, max_bytes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
        int(sys.argv[4])
    cache = DiskCache(DiskCacheConfig(path=path, max_bytes=max_bytes, min_tokens=4),
                      key="shared")
    rng = random.Random(me)
    stats = {"puts": 0, "lookups": 0, "hits": 0, "hits_from_others": 0, "mismatches": 0,
             "vanished": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if rng.random() < 0.4:
            tokens = sequence(me, rng.randrange(PER_WORKER))
            cache.put(tokens, state_for(tokens))
            stats["puts"] += 1
        else:
            writer = rng.randrange(WORKERS)
            tokens = sequence(writer, rng.randrange(PER_WORKER))
            stats["lookups"] += 1
            for length, name in cache.lookup([*tokens, 1, 2, 3]):
                data = cache.read(name, tokens[:length])
                if data is None:
                    stats["vanished"] += 1  # evicted by another process: a miss, no error
                    continue
                if data != state_for(tokens[:length]):
                    stats["mismatches"] += 1
                stats["hits"] += 1
                stats["hits_from_others"] += writer != me
                break
        time.sleep(rng.random() * 0.004)
    cache.close()
    print(json.dumps(stats))
    return 1 if stats["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())

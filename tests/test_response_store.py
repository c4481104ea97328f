"""The Responses store, in memory and in a directory replicas share: bounds, age, ids that
try to leave the directory, damaged files, and several processes writing at once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from api.responses.store import DirectoryResponseStore, MemoryResponseStore, ResponseStore


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def response(rid: str, text: str = "hi") -> dict[str, Any]:
    return {"id": rid, "object": "response", "output": [{"text": text}]}


@pytest.fixture(params=["memory", "directory"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    def build(max_items: int = 100, max_bytes: int = 1 << 20, ttl: float = 0) -> ResponseStore:
        if request.param == "memory":
            return MemoryResponseStore(max_items, max_bytes, ttl)
        return DirectoryResponseStore(str(tmp_path / "store"), max_items, max_bytes, ttl)
    return build


def test_put_get_delete(make: Any) -> None:
    store = make()
    run(store.put(response("resp_1.k"), [{"role": "user", "content": "a"}]))
    got = run(store.get("resp_1.k"))
    assert got.response["id"] == "resp_1.k" and got.conversation[0]["content"] == "a"
    assert run(store.delete("resp_1.k")) and not run(store.delete("resp_1.k"))
    assert run(store.get("resp_1.k")) is None


def test_oldest_go_first_past_the_count_and_byte_bounds(make: Any) -> None:
    store = make(max_items=3)
    for i in range(5):
        run(store.put(response(f"resp_{i}"), []))
        time.sleep(0.01)  # distinct mtimes
    assert [run(store.get(f"resp_{i}")) is not None for i in range(5)] == [False, False, True,
                                                                           True, True]
    small = make(max_items=100, max_bytes=600)
    for i in range(5):
        run(small.put(response(f"resp_b{i}", "x" * 100), []))
        time.sleep(0.01)
    kept = [i for i in range(5) if run(small.get(f"resp_b{i}")) is not None]
    assert kept and kept == list(range(5 - len(kept), 5)) and len(kept) < 5


def test_expired_responses_are_gone(make: Any) -> None:
    store = make(ttl=0.2)
    run(store.put(response("resp_old"), []))
    time.sleep(0.3)
    assert run(store.get("resp_old")) is None


def test_ids_that_would_leave_the_directory_touch_nothing(tmp_path: Path) -> None:
    store = DirectoryResponseStore(str(tmp_path / "store"), 100, 1 << 20, 0)
    (tmp_path / "secret.json").write_text(json.dumps(
        {"response": {"id": "x"}, "conversation": [], "stored_at": time.time()}))
    for rid in ("../secret", "..", "/etc/passwd", ".lock", "a/b", "resp_\x00", "resp_\ud800",
                "", "x" * 300):
        assert run(store.get(rid)) is None
        assert not run(store.delete(rid))
        run(store.put(response(rid), []))  # not stored, no error
    assert (tmp_path / "secret.json").exists()
    assert [p.name for p in (tmp_path / "store").iterdir() if p.name != ".lock"] == []


def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    store = DirectoryResponseStore(str(tmp_path), 100, 1 << 20, 0)
    (tmp_path / "resp_bad.json").write_text("{not json")
    assert run(store.get("resp_bad")) is None and not (tmp_path / "resp_bad.json").exists()


WRITER = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from api.responses.store import DirectoryResponseStore
store = DirectoryResponseStore(sys.argv[2], 40, 1 << 20, 0)
async def main():
    for i in range(60):
        await store.put({"id": f"resp_{sys.argv[3]}_{i}", "output": "x" * 200}, [])
        other = await store.get(f"resp_{int(sys.argv[3]) ^ 1}_{i}")
        assert other is None or other.response["output"] == "x" * 200
asyncio.run(main())
"""


def test_processes_sharing_the_directory_keep_its_bounds(tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, root, str(tmp_path), str(i)],
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    names = [n for n in os.listdir(tmp_path) if n.endswith(".json")]
    assert len(names) <= 40 and not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    store = DirectoryResponseStore(str(tmp_path), 40, 1 << 20, 0)
    assert all(run(store.get(n[:-5])) is not None for n in names)

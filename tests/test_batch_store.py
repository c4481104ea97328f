"""The Batch API's SQLite store and input validation, without a server."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

from api.batch.store import BatchStore, FileRow
from api.batch.validate import check_file


def _line(i: int, url: str = "/v1/chat/completions", **extra: object) -> bytes:
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url,
                       "body": {"messages": [{"role": "user", "content": str(i)}]},
                       **extra}).encode() + b"\n"


def _store_file(store: BatchStore, fid: str, content: bytes, created: int = 100) -> None:
    store.temp_path(fid).write_bytes(content)
    store.add_file(FileRow(fid, "batch", "in.jsonl", len(content), content.count(b"\n"),
                           created))


def _batch(bid: str, fid: str, created: int = 100) -> dict[str, object]:
    return {"id": bid, "status": "validating", "created_at": created, "input_file_id": fid,
            "endpoint": "/v1/chat/completions"}


def test_lines_finish_once_and_survive_a_reopen(tmp_path: Path) -> None:
    content = b"".join(_line(i) for i in range(5))
    store = BatchStore(str(tmp_path))
    _store_file(store, "file_a", content)
    checked = check_file(io.BytesIO(content), "/v1/chat/completions", 10)
    assert not checked.errors and [x.custom_id for x in checked.lines] == [
        f"c{i}" for i in range(5)]
    batch = _batch("batch_1", "file_a")
    store.create_batch(batch)
    batch["status"] = "in_progress"
    store.start_batch(batch, checked.lines)
    line = checked.lines[2]
    assert store.read_line("file_a", line.offset, line.length) == _line(2)
    store.finish_line("batch_1", 2, 200, '{"a": 1}')
    store.finish_line("batch_1", 2, 500, '{"again": 1}')  # a finished line stays finished
    store.finish_line("batch_1", 3, 400, '{"b": 1}')
    store.close()

    store = BatchStore(str(tmp_path))  # as after a restart
    assert store.counts("batch_1") == (5, 1, 1)
    assert [x.idx for x in store.pending("batch_1", -1, 10)] == [0, 1, 4]
    assert [x.idx for x in store.pending("batch_1", 1, 10)] == [4]
    assert list(store.results("batch_1", True)) == ['{"a": 1}']
    assert list(store.results("batch_1", False)) == ['{"b": 1}']
    assert store.active_batches()[0]["status"] == "in_progress"
    assert store.file_in_use("file_a") == "batch_1"
    store.temp_path("file_out").write_bytes(b'{"a": 1}\n')
    batch["status"] = "completed"
    store.finalize(batch, [FileRow("file_out", "batch_output", "o.jsonl", 9, 1, 101)])
    assert store.counts("batch_1") == (0, 0, 0)  # lines dropped once the files exist
    assert store.batch("batch_1")["status"] == "completed"  # type: ignore[index]
    assert store.path("file_out").read_bytes() == b'{"a": 1}\n'
    assert store.file_in_use("file_a") is None
    # WAL: another connection sees committed rows
    other = sqlite3.connect(tmp_path / "batches.sqlite3")
    assert other.execute("SELECT COUNT(*) FROM files").fetchone()[0] == 2
    other.close()
    store.close()


def test_pages_retention_and_orphans(tmp_path: Path) -> None:
    store = BatchStore(str(tmp_path))
    for i in range(5):
        _store_file(store, f"file_{i}", _line(i), created=100 + i)
        store.create_batch({**_batch(f"batch_{i}", f"file_{i}", 100 + i),
                            "status": "completed"})
    assert [b["id"] for b in store.batches(None, 2)] == ["batch_4", "batch_3"]
    assert [b["id"] for b in store.batches("batch_3", 10)] == ["batch_2", "batch_1", "batch_0"]
    assert [f.id for f in store.files("batch", "file_1", 2, True)] == ["file_2", "file_3"]
    assert [f.id for f in store.files(None, None, 2, False)] == ["file_4", "file_3"]
    assert store.used_bytes() == sum(len(_line(i)) for i in range(5))
    store.create_batch({**_batch("batch_run", "file_0", 50), "status": "in_progress"})
    # older than 103: files 0-2 and batches 0-2, except file_0 (a running batch reads it)
    assert store.expire(retention=10, now=113) == 2 + 3
    assert {f.id for f in store.files(None, None, 10, True)} == {"file_0", "file_3", "file_4"}
    assert store.batch("batch_1") is None and store.batch("batch_run") is not None
    store.temp_path("file_x").write_bytes(b"partial")  # a crash mid-upload
    store.close()
    BatchStore(str(tmp_path)).close()
    assert not (tmp_path / "files" / "file_x.part").exists()


def test_validation_errors_name_the_line() -> None:
    content = b"".join([
        _line(0), b"{not json\n", b"\n", _line(0), _line(3, url="/v1/embeddings"),
        _line(4, method="GET"), b'{"custom_id": "c5", "method": "POST", '
        b'"url": "/v1/chat/completions", "body": [1]}\n', b"[1, 2]\n", b"[" * 100_000 + b"\n",
        json.dumps({"custom_id": "s", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"stream": True}}).encode()])
    checked = check_file(io.BytesIO(content), "/v1/chat/completions", 100)
    assert [(e["line"], e["code"]) for e in checked.errors] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_endpoint"),
        (5, "invalid_method"), (6, "invalid_request"), (7, "invalid_json_line"),
        (8, "invalid_json_line"), (9, "invalid_request")]
    assert [x.idx for x in checked.lines] == [0]
    too_many = check_file(io.BytesIO(b"".join(_line(i) for i in range(4))),
                          "/v1/chat/completions", 3)
    assert [e["code"] for e in too_many.errors] == ["too_many_lines"]
    assert check_file(io.BytesIO(b"\n\n"), "/v1/chat/completions", 3).errors[0]["code"] == \
        "empty_file"


class _NoModel:
    """The worker's view of a server with no model loaded: one line at a time."""

    @property
    def default(self) -> None:
        from api.web.errors import APIError
        raise APIError("not loaded", status=503)


def test_a_line_answered_503_is_not_recorded_and_runs_again(tmp_path: Path) -> None:
    """The engine down or the queue full (503 / 429) is the server's state, not the line's:
    the worker leaves the line pending and runs it again; the batch completes with every
    line answered once."""
    import asyncio
    import time

    from api.batch.runner import BatchService
    from engine.config import ServerConfig

    content = b"".join(_line(i) for i in range(4))
    calls: dict[bytes, int] = {}

    async def dispatch(path: str, body: bytes) -> tuple[int, object]:
        calls[body] = calls.get(body, 0) + 1
        if b'"content": "2"' in body and calls[body] == 1:
            return 503, {"error": {"message": "down"}}
        return 200, {"echo": json.loads(body)}

    async def main() -> dict[str, object]:
        service = BatchService(_NoModel(), None,  # type: ignore[arg-type]
                               ServerConfig(batch_dir=str(tmp_path)), None)
        service.dispatch = dispatch  # type: ignore[method-assign]
        _store_file(service.store, "file_in", content, created=int(time.time()))
        service.store.create_batch({**_batch("batch_r", "file_in", int(time.time())),
                                    "expires_at": time.time() + 60})
        service.start()
        for _ in range(200):
            batch = service.store.batch("batch_r")
            assert batch is not None
            if batch["status"] == "completed":
                service.stop()
                return batch
            await asyncio.sleep(0.05)
        raise AssertionError(service.store.batch("batch_r"))

    batch = asyncio.run(main())
    assert batch["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert sorted(calls.values()) == [1, 1, 1, 2]
    out = (tmp_path / "files" / str(batch["output_file_id"])).read_text().splitlines()
    assert [json.loads(x)["custom_id"] for x in out] == ["c0", "c1", "c2", "c3"]

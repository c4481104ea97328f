"""The Batch API's store: files, batches and per-line progress in SQLite (WAL) under
``server.batch_dir``, file contents beside it (``files/<id>``).

Blocking; the routes and the runner call it from one thread (``BatchService.io``). A
line's result is committed in the same transaction that marks it done, so after a crash
(kill -9 included) a finished line is never run again and an unfinished one runs again.
A batch directory belongs to one server process (docs/BATCH.md).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files(
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, lines INTEGER NOT NULL, created_at INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS batches(
    id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, status TEXT NOT NULL, data TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS lines(
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL,
    offset INTEGER NOT NULL, length INTEGER NOT NULL, done INTEGER NOT NULL DEFAULT 0,
    status_code INTEGER, result TEXT, PRIMARY KEY(batch_id, idx));
CREATE INDEX IF NOT EXISTS lines_pending ON lines(batch_id, done, idx);
"""

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True)
class FileRow:
    id: str
    purpose: str
    filename: str
    bytes: int
    lines: int
    created_at: int
    owner: str = ""  # a hash of the API key that uploaded it ("" without keys)

    def json(self, expires_at: int | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": expires_at,
                "status_details": None}


@dataclass(frozen=True)
class Line:
    idx: int
    custom_id: str
    offset: int
    length: int


class BatchStore:
    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self.files_dir = self.dir / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "batches.sqlite3", check_same_thread=False,
                                  isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable against process death
        self.db.executescript(_SCHEMA)
        self._sweep_orphans()

    def close(self) -> None:
        self.db.close()

    # -- files ---------------------------------------------------------------
    def path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def temp_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.part"

    def add_file(self, row: FileRow) -> None:
        """``temp_path(row.id)`` holds the content: renamed into place, then recorded."""
        os.replace(self.temp_path(row.id), self.path(row.id))
        self._insert_file(row)

    def _insert_file(self, row: FileRow) -> None:
        self.db.execute("INSERT INTO files VALUES(?,?,?,?,?,?,?)",
                        (row.id, row.purpose, row.filename, row.bytes, row.lines,
                         row.created_at, row.owner))

    def file(self, file_id: str, owner: str | None = None) -> FileRow | None:
        """A file by id (only the owner's, with ``owner``)."""
        r = self.db.execute("SELECT * FROM files WHERE id=?", (file_id,)).fetchone()
        return FileRow(*r) if r and owner in (None, r[6]) else None

    def files(self, purpose: str | None, after: str | None, limit: int,
              ascending: bool, owner: str = "") -> list[FileRow]:
        sql, args = "SELECT * FROM files WHERE owner=?", list[Any]([owner])
        if purpose:
            sql += " AND purpose=?"
            args.append(purpose)
        if after:
            ref = self.db.execute("SELECT rowid FROM files WHERE id=?", (after,)).fetchone()
            if ref is not None:
                sql += f" AND rowid {'>' if ascending else '<'} ?"
                args.append(ref[0])
        sql += f" ORDER BY rowid {'ASC' if ascending else 'DESC'} LIMIT ?"
        return [FileRow(*r) for r in self.db.execute(sql, [*args, limit])]

    def file_in_use(self, file_id: str) -> str | None:
        """An active batch reading this file."""
        for (bid, data) in self.db.execute(
                "SELECT id, data FROM batches WHERE status IN (?,?,?,?)", ACTIVE):
            if json.loads(data)["input_file_id"] == file_id:
                return str(bid)
        return None

    def delete_file(self, file_id: str) -> bool:
        gone = self.db.execute("DELETE FROM files WHERE id=?", (file_id,)).rowcount > 0
        self.path(file_id).unlink(missing_ok=True)
        return gone

    def used_bytes(self) -> int:
        return int(self.db.execute("SELECT COALESCE(SUM(bytes),0) FROM files").fetchone()[0]
                   + self.db.execute("SELECT COALESCE(SUM(LENGTH(result)),0) FROM lines")
                   .fetchone()[0])

    def read_line(self, file_id: str, offset: int, length: int) -> bytes:
        with open(self.path(file_id), "rb") as f:
            f.seek(offset)
            return f.read(length)

    # -- batches -------------------------------------------------------------
    def create_batch(self, batch: dict[str, Any], owner: str = "") -> None:
        self.db.execute("INSERT INTO batches VALUES(?,?,?,?,?)",
                        (batch["id"], batch["created_at"], batch["status"], json.dumps(batch),
                         owner))

    def batch(self, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """A batch by id (only the owner's, with ``owner``)."""
        r = self.db.execute("SELECT data, owner FROM batches WHERE id=?",
                            (batch_id,)).fetchone()
        return json.loads(r[0]) if r and owner in (None, r[1]) else None

    def batch_owner(self, batch_id: str) -> str:
        r = self.db.execute("SELECT owner FROM batches WHERE id=?", (batch_id,)).fetchone()
        return str(r[0]) if r else ""

    def queued_lines(self, owner: str) -> int:
        """Lines of the owner's active batches (their input files' lines)."""
        placeholders = ",".join("?" * len(ACTIVE))
        r = self.db.execute(
            "SELECT COALESCE(SUM(f.lines), 0) FROM batches b JOIN files f "
            "ON f.id = json_extract(b.data, '$.input_file_id') "
            f"WHERE b.owner=? AND b.status IN ({placeholders})", (owner, *ACTIVE)).fetchone()
        return int(r[0])

    def batches(self, after: str | None, limit: int, owner: str = "") -> list[dict[str, Any]]:
        """Newest first, as OpenAI lists them (rowid: the order they were created in)."""
        sql, args = "SELECT data FROM batches WHERE owner=?", list[Any]([owner])
        if after:
            ref = self.db.execute("SELECT rowid FROM batches WHERE id=?", (after,)).fetchone()
            if ref is not None:
                sql += " AND rowid < ?"
                args.append(ref[0])
        sql += " ORDER BY rowid DESC LIMIT ?"
        return [json.loads(r[0]) for r in self.db.execute(sql, [*args, limit])]

    def active_batches(self) -> list[dict[str, Any]]:
        """Oldest first: the order the runner works in."""
        return [json.loads(r[0]) for r in self.db.execute(
            "SELECT data FROM batches WHERE status IN (?,?,?,?) ORDER BY rowid",
            ACTIVE)]

    def update_batch(self, batch: dict[str, Any]) -> None:
        self.db.execute("UPDATE batches SET status=?, data=? WHERE id=?",
                        (batch["status"], json.dumps(batch), batch["id"]))

    def start_batch(self, batch: dict[str, Any], lines: list[Line]) -> None:
        """Validated: its lines recorded and the batch in_progress, in one transaction."""
        with self._tx():
            self.db.execute("DELETE FROM lines WHERE batch_id=?", (batch["id"],))
            self.db.executemany("INSERT INTO lines(batch_id, idx, custom_id, offset, length) "
                                "VALUES(?,?,?,?,?)",
                                [(batch["id"], x.idx, x.custom_id, x.offset, x.length)
                                 for x in lines])
            self.update_batch(batch)

    # -- lines ---------------------------------------------------------------
    def pending(self, batch_id: str, after: int, limit: int) -> list[Line]:
        return [Line(*r) for r in self.db.execute(
            "SELECT idx, custom_id, offset, length FROM lines "
            "WHERE batch_id=? AND done=0 AND idx>? ORDER BY idx LIMIT ?",
            (batch_id, after, limit))]

    def finish_line(self, batch_id: str, idx: int, status_code: int, result: str) -> None:
        """The line's result and its done mark, committed together."""
        self.db.execute("UPDATE lines SET done=1, status_code=?, result=? "
                        "WHERE batch_id=? AND idx=? AND done=0",
                        (status_code, result, batch_id, idx))

    def counts(self, batch_id: str) -> tuple[int, int, int]:
        """(total, completed, failed) lines."""
        r = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(done=1 AND status_code<300),0), "
            "COALESCE(SUM(done=1 AND status_code>=300),0) FROM lines WHERE batch_id=?",
            (batch_id,)).fetchone()
        return int(r[0]), int(r[1]), int(r[2])

    def results(self, batch_id: str, ok: bool) -> Iterator[str]:
        op = "<" if ok else ">="
        for (result,) in self.db.execute(
                f"SELECT result FROM lines WHERE batch_id=? AND done=1 AND status_code{op}300 "
                "ORDER BY idx", (batch_id,)):
            yield str(result)

    def finalize(self, batch: dict[str, Any], outputs: list[FileRow]) -> None:
        """Output files (already in their temp paths) recorded, the batch's final state
        written and its lines dropped, in one transaction."""
        for row in outputs:
            os.replace(self.temp_path(row.id), self.path(row.id))
        with self._tx():
            for row in outputs:
                self._insert_file(row)
            self.db.execute("DELETE FROM lines WHERE batch_id=?", (batch["id"],))
            self.update_batch(batch)

    # -- retention -----------------------------------------------------------
    def expire(self, retention: float, now: float | None = None) -> int:
        """Delete files and finished batches older than ``retention`` seconds (files an
        active batch reads are kept). Returns how many rows went."""
        cutoff = int((now or time.time()) - retention)
        gone = 0
        for (fid,) in self.db.execute("SELECT id FROM files WHERE created_at < ?",
                                      (cutoff,)).fetchall():
            if self.file_in_use(fid) is None:
                gone += self.delete_file(fid)
        placeholders = ",".join("?" * len(ACTIVE))
        gone += self.db.execute(f"DELETE FROM batches WHERE created_at < ? AND status NOT IN "
                                f"({placeholders})", (cutoff, *ACTIVE)).rowcount
        return gone

    def _sweep_orphans(self) -> None:
        """Content files without a row (a crash between writing and recording) go."""
        known = {r[0] for r in self.db.execute("SELECT id FROM files")}
        for p in self.files_dir.iterdir():
            if p.name not in known:
                p.unlink(missing_ok=True)

    def _tx(self) -> _Tx:
        return _Tx(self.db)


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")

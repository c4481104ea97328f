"""Batch API helpers shared by the tests: a JSONL input, waiting for a batch's end, its
output lines by custom_id, and a batch holding every sequence of a server."""

from __future__ import annotations

import json
import time
from typing import Any

from openai import OpenAI
from openai.types import Batch

from conftest import ServerProcess


def jsonl(url: str, bodies: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url,
                                "body": b}).encode() + b"\n" for i, b in enumerate(bodies))


def wait(client: OpenAI, batch_id: str, timeout: float = 120) -> Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


def lines(client: OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    out = [json.loads(x) for x in client.files.content(file_id).text.splitlines()]
    by_id = {x["custom_id"]: x for x in out}
    assert len(by_id) == len(out)  # every custom_id once
    return by_id


def hold_every_sequence(server: ServerProcess, client: OpenAI,
                        bodies: list[dict[str, Any]], n_seq: int) -> Batch:
    """A chat batch of ``bodies`` submitted, returned once its lines hold all ``n_seq``
    sequences (not still queued in the engine, where a user's request would simply go
    ahead of them)."""
    f = client.files.create(file=("input.jsonl", jsonl("/v1/chat/completions", bodies)),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while server.metrics()["llamaserve_batch_lines_running"] < n_seq or \
            server.metrics()["llamaserve_sequences_in_use"] < n_seq:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return batch

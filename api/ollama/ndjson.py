"""Ollama's framing: one JSON object per line (``application/x-ndjson``), a timestamp on
each, an empty chunk as the keep-alive of a silent stream (a comment would break clients
that parse every line), and an ``{"error": ...}`` line when a stream fails midway."""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

from api.web.engine_client import Generation
from api.web.streaming import BeatingResponse

MEDIA_TYPE = "application/x-ndjson"


def created_at() -> str:
    """RFC 3339 in UTC, as Ollama stamps every chunk."""
    stamp = datetime.datetime.now(datetime.timezone.utc)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


def line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def ndjson_response(chunks: AsyncIterator[bytes], *, gen: Generation | None = None,
                    keepalive: float = 0, beat: bytes = b"") -> BeatingResponse:
    """Stream ``chunks`` (with ``beat`` lines in silences, if any); when the client leaves,
    Starlette cancels the iterator and the generation (if any) is cancelled, freeing its
    sequence at the engine's next step."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            if gen is not None:
                gen.cancel()

    return BeatingResponse(body(), keepalive if beat else 0, beat, media_type=MEDIA_TYPE,
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

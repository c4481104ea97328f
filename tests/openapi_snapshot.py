"""Cut OpenAI's OpenAPI description down to the routes llamaserve implements.

The full description (openai/openai-openapi, ``openapi.json``, 3.4 MB) covers every
OpenAI product. The tests keep only what this server answers: the paths below and every
schema they reach, plus the error body. Run it on a newer ``openapi.json`` to move the
snapshot forward::

    python tests/openapi_snapshot.py path/to/openapi.json

It writes ``tests/fixtures/openai-openapi.json.gz``; ``tests/openapi_check.py`` reads it.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).parent / "fixtures" / "openai-openapi.json.gz"

PATHS = (
    "/models", "/models/{model}",
    "/chat/completions", "/completions", "/embeddings",
    "/files", "/files/{file_id}", "/files/{file_id}/content",
    "/batches", "/batches/{batch_id}", "/batches/{batch_id}/cancel",
    "/responses", "/responses/{response_id}", "/responses/{response_id}/cancel",
    "/responses/{response_id}/input_items", "/responses/input_tokens",
    "/conversations", "/conversations/{conversation_id}",
    "/conversations/{conversation_id}/items", "/conversations/{conversation_id}/items/{item_id}",
)
EXTRA_SCHEMAS = ("ErrorResponse", "ResponsesWebSocketStreamEvent", "ResponseWsError")


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def trim(spec: dict[str, Any]) -> dict[str, Any]:
    """The description with only ``PATHS`` and the schemas they reach."""
    paths = {path: spec["paths"][path] for path in PATHS if path in spec["paths"]}
    schemas = spec["components"]["schemas"]
    wanted: set[str] = set(EXTRA_SCHEMAS)
    _refs(paths, wanted)
    done: set[str] = set()
    while wanted - done:
        name = (wanted - done).pop()
        done.add(name)
        _refs(schemas[name], wanted)
    return {"openapi": spec["openapi"], "info": spec["info"], "paths": paths,
            "components": {"schemas": {name: schemas[name] for name in sorted(done)}}}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    kept = trim(spec)
    SNAPSHOT.write_bytes(gzip.compress(json.dumps(kept, sort_keys=True).encode(), mtime=0))
    print(f"{len(kept['paths'])} paths, {len(kept['components']['schemas'])} schemas, "
          f"version {kept['info']['version']} -> {SNAPSHOT} ({SNAPSHOT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

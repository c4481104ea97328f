"""OpenAI's Files API (``purpose: "batch"``) and Batch API routes over ``BatchService``."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from api.batch.runner import BatchService, new_id
from api.batch.store import FileRow
from api.batch.validate import ENDPOINTS
from api.web.errors import APIError, invalid
from api.web.gate import api_key
from api.web.params import Body, read_json
from api.web.state import ServerState

MULTIPART_SLACK = 64 * 1024  # headers and the form's other fields around the file
COPY_CHUNK = 1 << 20


def _service(request: Request) -> BatchService:
    server: ServerState = request.app.state.llama
    if server.batches is None:
        raise APIError("The Batch API is off on this server (server.batch_api is false)",
                       status=404, code="batches_disabled")
    service: BatchService = server.batches
    return service


def owner(request: Request) -> str:
    """Whose files and batches a request sees: a hash of its API key when the server has
    keys (each key sees only its own), else "" (one owner)."""
    server: ServerState = request.app.state.llama
    if not server.config.server.api_keys:
        return ""
    return hashlib.sha256((api_key(request.scope) or "").encode()).hexdigest()[:32]


def _not_found(kind: str, ident: str) -> APIError:
    return APIError(f"No such {kind} object: {ident}", status=404, param="id",
                    code="not_found")


def _limit(request: Request, default: int = 20, top: int = 100) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= top:
        raise invalid("limit", f"'limit' must be an integer from 1 to {top}")
    return int(raw)


def _page(data: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    more = len(data) > limit
    data = data[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


def _too_large(limit: int) -> APIError:
    return APIError(f"The file is larger than {limit} bytes (server.batch_file_max_bytes)",
                    status=413, code="file_too_large", param="file")


# -- files -------------------------------------------------------------------------
async def upload_file(request: Request) -> Response:
    service = _service(request)
    cfg = service.cfg
    limit = cfg.batch_file_max_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and len(length) < 20 and \
            int(length) > limit + MULTIPART_SLACK:
        raise _too_large(limit)  # refused before a byte of it is read
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError("Upload the file as multipart/form-data with 'file' and 'purpose'",
                       param="file", code="invalid_value")
    received = 0
    inner = request.receive

    async def receive() -> Any:  # stop reading a body past the limit, declared or not
        nonlocal received
        message = await inner()
        received += len(message.get("body", b""))
        if received > limit + MULTIPART_SLACK:
            raise _too_large(limit)
        return message

    limited = Request(request.scope, receive)
    async with limited.form(max_files=1, max_fields=8) as form:
        purpose = form.get("purpose")
        upload = form.get("file")
        if purpose != "batch":
            raise invalid("purpose", "'purpose' must be 'batch' (the only purpose this "
                          "server stores files for)")
        if not isinstance(upload, UploadFile):
            raise invalid("file", "'file' is required: the JSONL input of a batch")
        fid = new_id("file")
        filename = (upload.filename or "input.jsonl")[:256]
        size, lines = await service.io(_copy, service, upload, fid, limit)
    if not lines:
        raise invalid("file", "The file has no lines")
    used = await service.io(service.store.used_bytes)
    if used + size > cfg.batch_max_bytes:
        service.store.temp_path(fid).unlink(missing_ok=True)
        raise APIError(f"The batch store is full ({used} of {cfg.batch_max_bytes} bytes, "
                       "server.batch_max_bytes); delete files or wait for retention",
                       status=413, code="storage_full", param="file")
    if lines > cfg.batch_max_lines:
        service.store.temp_path(fid).unlink(missing_ok=True)
        raise invalid("file", f"The file has {lines} lines; a batch takes at most "
                      f"{cfg.batch_max_lines} (server.batch_max_lines)", "too_many_lines")
    row = FileRow(fid, "batch", filename, size, lines, int(time.time()), owner(request))
    await service.io(service.store.add_file, row)
    return JSONResponse(row.json())


def _copy(service: BatchService, upload: UploadFile, fid: str, limit: int) -> tuple[int, int]:
    """The spooled upload into the store's temp path: (bytes, non-empty lines)."""
    size = lines = 0
    last = b"\n"
    path = service.store.temp_path(fid)
    try:
        with open(path, "wb") as out:
            upload.file.seek(0)
            while chunk := upload.file.read(COPY_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                lines += chunk.count(b"\n")
                out.write(chunk)
                last = chunk[-1:]
            if last != b"\n":
                out.write(b"\n")
                size += 1
                lines += 1
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return size, lines


async def list_files(request: Request) -> Response:
    service = _service(request)
    limit = _limit(request, 10000, 10000)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "'order' must be 'asc' or 'desc'")
    rows = await service.io(service.store.files, request.query_params.get("purpose"),
                            request.query_params.get("after"), limit + 1, order == "asc",
                            owner(request))
    return JSONResponse(_page([r.json() for r in rows], limit))


async def _file(request: Request) -> tuple[BatchService, FileRow]:
    service = _service(request)
    fid = request.path_params["file_id"]
    row = await service.io(service.store.file, fid, owner(request))
    if row is None:
        raise _not_found("File", fid)
    return service, row


async def get_file(request: Request) -> Response:
    _, row = await _file(request)
    return JSONResponse(row.json())


async def file_content(request: Request) -> Response:
    service, row = await _file(request)
    return FileResponse(service.store.path(row.id), media_type="application/jsonl",
                        filename=row.filename)


async def delete_file(request: Request) -> Response:
    service, row = await _file(request)
    user = await service.io(service.store.file_in_use, row.id)
    if user is not None:
        raise APIError(f"The file is the input of batch {user}, which is still running; "
                       "cancel it first", status=409, code="file_in_use", param="file_id")
    await service.io(service.store.delete_file, row.id)
    return JSONResponse({"id": row.id, "object": "file", "deleted": True})


# -- batches -----------------------------------------------------------------------
async def create_batch(request: Request) -> Response:
    service = _service(request)
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    file_id = body.string("input_file_id")
    if not file_id:
        raise invalid("input_file_id", "'input_file_id' is required", "missing_required_parameter")
    endpoint = body.string("endpoint")
    if endpoint not in ENDPOINTS:
        raise invalid("endpoint", f"'endpoint' must be one of {', '.join(ENDPOINTS)}")
    window = body.string("completion_window") or "24h"
    if window != "24h":
        raise invalid("completion_window", "'completion_window' must be '24h'")
    metadata = body.obj("metadata")
    if metadata is not None and (len(metadata) > 16 or any(
            not isinstance(v, str) or len(k) > 64 or len(v) > 512
            for k, v in metadata.items())):
        raise invalid("metadata", "'metadata' holds at most 16 string pairs (keys up to 64 "
                      "characters, values up to 512)")
    who = owner(request)
    row = await service.io(service.store.file, file_id, who)
    if row is None:
        raise _not_found("File", file_id)
    if row.purpose != "batch":
        raise invalid("input_file_id", f"The file {file_id} has purpose '{row.purpose}', "
                      "not 'batch'")
    cap = service.cfg.batch_max_queued_lines
    if cap:
        queued = await service.io(service.store.queued_lines, who)
        if queued + row.lines > cap:
            raise APIError(f"This key has {queued} batch lines queued; {row.lines} more would "
                           f"pass the limit of {cap} (server.batch_max_queued_lines)",
                           status=429, code="batch_queue_full", param="input_file_id")
    now = int(time.time())
    batch: dict[str, Any] = {
        "id": new_id("batch"), "object": "batch", "endpoint": endpoint, "errors": None,
        "input_file_id": file_id, "completion_window": window, "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now,
        "in_progress_at": None, "expires_at": now + 86400, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
        "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": metadata, "model": body.data.get("model")
        if isinstance(body.data.get("model"), str) else None}
    await service.io(service.store.create_batch, batch, who)
    service.notify()
    return JSONResponse(batch)


async def _batch(request: Request) -> tuple[BatchService, dict[str, Any]]:
    service = _service(request)
    bid = request.path_params["batch_id"]
    batch = await service.io(service.store.batch, bid, owner(request))
    if batch is None:
        raise _not_found("Batch", bid)
    return service, batch


async def get_batch(request: Request) -> Response:
    service, batch = await _batch(request)
    return JSONResponse(await service.live(batch))


async def list_batches(request: Request) -> Response:
    service = _service(request)
    limit = _limit(request)
    rows = await service.io(service.store.batches, request.query_params.get("after"),
                            limit + 1, owner(request))
    return JSONResponse(_page([await service.live(b) for b in rows], limit))


async def cancel_batch(request: Request) -> Response:
    service, batch = await _batch(request)
    status = batch["status"]
    if status == "cancelling":
        return JSONResponse(await service.live(batch))  # asked twice: still on its way
    if status not in ("validating", "in_progress"):
        raise APIError(f"Cannot cancel a batch with status '{status}'", status=409,
                       code="batch_not_cancellable", param="batch_id")
    batch.update(status="cancelling", cancelling_at=int(time.time()))
    service.cancelled.add(batch["id"])
    await service.io(service.store.update_batch, batch)
    service.notify()
    return JSONResponse(await service.live(batch))


BATCH_ROUTES = [
    Route("/v1/files", upload_file, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", get_file, methods=["GET"]),
    Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]

"""Code infill (fill-in-the-middle): ``POST /infill`` (llama-server's shape, which editor
plugins such as llama.vscode call) and the prompt that ``/v1/completions`` builds for a
``suffix``.

The prompt uses the model's own FIM tokens (read from the vocabulary, never spelled
out here), prefix-suffix-middle order::

    [BOS] [REP]project\\n [SEP]file\\n chunk … [SEP]filename\\n   (only with input_extra)
    [PRE] prefix prompt [SUF] suffix [MID]

so successive keystrokes, whose prefix grows, share the prompt's head with the previous
request and the prefix cache evaluates only what changed. What does not fit the
sequence's context (after room for the answer) is cut: extra chunks first (the oldest),
then the prefix from its start and the suffix from its end, three parts prefix to one
part suffix.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.web.errors import APIError, invalid
from api.web.params import Body, read_json, sampling
from api.web.state import ModelState, ServerState
from api.web.streaming import (
    BeatingResponse,
    ChoiceResult,
    collect,
    sse,
    unless_disconnected,
)
from engine.handle import FimTokens, ModelHandle

MAX_EXTRA = 1024  # input_extra chunks per request
PROJECT = "myproject"  # the repository name llama-server uses
CURRENT_FILE = "filename"


@dataclass(frozen=True)
class InfillInput:
    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()  # (filename, text)
    prompt: str = ""  # text after the prefix, before the suffix marker


def fim_tokens_or_400(model: ModelHandle, param: str) -> FimTokens:
    fim = model.fim_tokens()
    if fim is None:
        raise invalid(param, "this model has no fill-in-the-middle tokens: infill is not "
                      "available")
    return fim


def fim_prompt(model: ModelHandle, fim: FimTokens, inp: InfillInput, room: int) -> list[int]:
    """The FIM prompt's tokens, at most ``room`` long (room >= 8)."""
    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False) if text else []

    extra: list[int] = []
    if inp.extra:
        if fim.rep is not None:
            extra += [fim.rep, *tok(PROJECT + "\n")]
        for name, text in inp.extra:
            extra += [fim.sep, *tok(name + "\n")] if fim.sep is not None else \
                tok("\n\n--- snippet ---\n\n")
            extra += tok(text)
        if fim.sep is not None:
            extra += [fim.sep, *tok(CURRENT_FILE + "\n")]
    prefix, suffix, prompt = tok(inp.prefix), tok(inp.suffix), tok(inp.prompt)
    bos = [model.bos_token] if model.adds_bos else []
    fixed = len(bos) + 3 + len(prompt)
    if fixed > room:
        raise invalid("prompt", "the infill prompt does not fit the context")
    left = room - fixed
    if len(prefix) + len(suffix) > left:
        n_suffix = min(len(suffix), left // 4)
        n_prefix = min(len(prefix), left - n_suffix)
        n_suffix = min(len(suffix), left - n_prefix)
        prefix, suffix = prefix[len(prefix) - n_prefix:], suffix[:n_suffix]
    left -= len(prefix) + len(suffix)
    extra = extra[len(extra) - min(len(extra), left):]
    return [*bos, *extra, fim.pre, *prefix, *prompt, fim.suf, *suffix, fim.mid]


def _texts(raw: Any, param: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise invalid(param, f"'{param}' must be a string")
    return raw


def parse_infill(body: Body) -> InfillInput:
    raw = body.data.get("input_extra") or []
    if not isinstance(raw, list) or len(raw) > MAX_EXTRA:
        raise invalid("input_extra", f"'input_extra' must be a list of at most {MAX_EXTRA} "
                      "{\"filename\", \"text\"} chunks")
    extra = []
    for i, chunk in enumerate(raw):
        if not isinstance(chunk, dict):
            raise invalid(f"input_extra[{i}]", "each chunk must be {\"filename\", \"text\"}")
        extra.append((_texts(chunk.get("filename"), f"input_extra[{i}].filename") or "tmp",
                      _texts(chunk.get("text"), f"input_extra[{i}].text")))
    return InfillInput(_texts(body.data.get("input_prefix"), "input_prefix"),
                       _texts(body.data.get("input_suffix"), "input_suffix"), tuple(extra),
                       _texts(body.data.get("prompt"), "prompt"))


def _room(state: ModelState, max_tokens: int | None) -> int:
    room = state.model.n_ctx_seq - (max_tokens or 16)
    if room < 8:
        raise invalid("n_predict", "no room for a prompt in the context after the answer")
    return room


def _stop_type(result: ChoiceResult) -> str:
    return {"length": "limit", "stop": "eos"}.get(result.finish_reason or "", "none")


async def infill(request: Request) -> Response:
    """llama-server's ``/infill``: ``input_prefix``, ``input_suffix``, ``input_extra``,
    ``prompt``; ``n_predict`` and the sampling fields; answers ``{"content", …}`` or,
    with ``stream``, SSE chunks of ``{"content", "stop"}``."""
    server: ServerState = request.app.state.llama
    data = await read_json(request, server.body_limits)
    state = await server.route(data.get("model"), request.scope)
    state.require_generative()
    n_predict = Body(data).integer("n_predict", None, -1)
    fields = {k: v for k, v in data.items() if k not in ("n_predict", "max_tokens")}
    if n_predict is not None and n_predict >= 0:
        fields["max_tokens"] = max(1, n_predict)
    body = Body(fields)
    inp = parse_infill(body)
    params = sampling(body, n_vocab=state.model.n_vocab,
                      defaults=state.model_config.sampling)
    fim = fim_tokens_or_400(state.model, "input_prefix")
    prompt = await state.client.run(fim_prompt, state.model, fim, inp,
                                    _room(state, params.max_tokens))
    gen = state.client.generate([prompt], params, 1, param="input_prefix",
                                adapters=state.adapters(body),
                                whole=not body.boolean("stream", False))
    started = time.monotonic()
    prompt_text = await state.client.run(state.model.detokenize, prompt, True)

    def final(res: ChoiceResult, content: str) -> dict[str, Any]:
        return {"index": 0, "content": content, "stop": True, "stop_type": _stop_type(res),
                "model": state.model_name, "tokens_predicted": res.completion_tokens,
                "tokens_evaluated": res.prompt_tokens, "tokens_cached": res.cached_tokens,
                "prompt": prompt_text, "truncated": False, "timings": {
                    "prompt_n": res.prompt_tokens - res.cached_tokens,
                    "predicted_n": res.completion_tokens,
                    "total_ms": round((time.monotonic() - started) * 1000, 1)}}

    if body.boolean("stream", False):
        async def chunks() -> AsyncIterator[bytes]:
            res = ChoiceResult(0)
            try:
                async for d in gen.deltas():
                    res.add(d)
                    if d.text:
                        yield sse({"index": 0, "content": d.text, "stop": False})
            except APIError as exc:
                yield sse(exc.body())
                return
            finally:
                gen.cancel()
            yield sse(final(res, ""))

        return BeatingResponse(chunks(), state.config.server.keepalive_seconds,
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
    (res,) = await unless_disconnected(request, gen, collect(gen))
    return JSONResponse(final(res, res.text))

"""POST /v1/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.chat.prepare import constrained
from api.chat.tools import completion_rules
from api.openai.infill import InfillInput, fim_prompt, fim_tokens_or_400
from api.web.errors import APIError, invalid
from api.web.params import Body, read_json, sampling
from api.web.state import ServerState, new_id
from api.web.streaming import (
    DONE,
    ChoiceResult,
    TextEvent,
    collect,
    error_event,
    final_usage,
    sse,
    sse_response,
    timeout_flag,
    unless_disconnected,
)
from engine.handle import ModelHandle
from engine.request import TokenLogprob

PromptInput = str | list[int]


def _prompts(body: Body, n_vocab: int) -> list[PromptInput]:
    raw = body.data.get("prompt")
    if raw is None:
        raise invalid("prompt", "'prompt' is required")
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            prompts: list[PromptInput] = [list(raw)]
        elif all(isinstance(p, str) for p in raw):
            prompts = list(raw)
        elif all(isinstance(p, list) and p and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p) for p in raw):
            prompts = [list(p) for p in raw]
        else:
            raise invalid("prompt", "'prompt' must be a string, a list of strings, a list of "
                                    "token ids, or a list of token-id lists")
        for p in prompts:
            if isinstance(p, list) and any(not 0 <= t < n_vocab for t in p):
                raise invalid("prompt", f"'prompt' has a token id outside [0, {n_vocab})")
        return prompts
    raise invalid("prompt", "'prompt' must be a non-empty string or list")


def _tokenize_all(model: ModelHandle, prompts: list[PromptInput]) -> list[tuple[list[int], str]]:
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append((model.tokenize(p, add_special=True, parse_special=True), p))
        else:
            out.append((p, model.detokenize(p, special=True)))
    return out


def _logprobs_json(model: ModelHandle, pairs: list[tuple[int, TokenLogprob | None]],
                   start: int = 0) -> dict[str, Any]:
    """OpenAI's completions logprobs object; a None entry (the first prompt token) has
    no logprob."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    pos = start
    for token, e in pairs:
        piece = model.piece(token).decode("utf-8", "replace")
        tokens.append(piece)
        token_lps.append(e.logprob if e else None)
        tops.append({model.piece(t).decode("utf-8", "replace"): lp for t, lp in e.top}
                    if e else None)
        offsets.append(pos)
        pos += len(piece)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def _generated(entries: list[TokenLogprob]) -> list[tuple[int, TokenLogprob | None]]:
    return [(e.token, e) for e in entries]


async def create_completion(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    state.require_generative()
    suffix = body.string("suffix") if body.data.get("suffix") is not None else None
    n = body.integer("n", 1, 1, state.max_n) or 1
    best_of = body.integer("best_of", None, 1, state.max_n)
    if best_of is not None and best_of != n:
        raise invalid("best_of", "'best_of' other than 'n' is not supported")
    stream = body.boolean("stream", False)
    echo = body.boolean("echo", False)
    logprobs = body.integer("logprobs", None, 0, 20)
    include_usage = bool((body.obj("stream_options") or {}).get("include_usage"))
    params = sampling(body, n_vocab=state.model.n_vocab,
                      defaults=state.model_config.sampling, logprobs=logprobs,
                      prompt_logprobs=echo and logprobs is not None)
    rules = completion_rules(body)
    if rules is not None:
        params = await constrained(state, rules, params, "json_schema")
    prompts = _prompts(body, state.model.n_vocab)
    if suffix is not None:  # insertion: the prompt is the text before, suffix after
        if echo or any(not isinstance(p, str) for p in prompts):
            raise invalid("suffix", "'suffix' needs text prompts and no 'echo'")
        fim = fim_tokens_or_400(state.model, "suffix")
        room = state.model.n_ctx_seq - (params.max_tokens or 16)
        tokenized = [(await state.client.run(fim_prompt, state.model, fim,
                                             InfillInput(str(p), suffix), room), str(p))
                     for p in prompts]
    else:
        tokenized = await state.client.tokenize(_tokenize_all, state.model, prompts,
                                                texts=prompts)
    gen = state.client.generate([t for t, _ in tokenized], params, n, param="prompt",
                                adapters=state.adapters(body), whole=not stream)
    echoes = [text if echo else "" for _, text in tokenized]
    cid, created = new_id("cmpl"), int(time.time())
    base = {"id": cid, "object": "text_completion", "created": created, "model": state.model_name}

    if stream:
        async def chunks() -> AsyncIterator[bytes]:
            results = {r.index: ChoiceResult(r.index) for r in gen.requests}
            for r in gen.requests:
                if echo:
                    yield sse({**base, "choices": [{"text": echoes[r.index // n],
                               "index": r.index, "logprobs": None, "finish_reason": None}]})
            text_events: dict[int, TextEvent] = {}  # the event nearly every token is
            try:
                async for d in gen.deltas():
                    results[d.index].add(d)
                    if not d.text and d.finish_reason is None and not d.logprobs:
                        continue
                    if logprobs is None and d.finish_reason is None:
                        event = text_events.get(d.index)
                        if event is None:
                            event = text_events[d.index] = TextEvent({**base, "choices": [{
                                "text": TextEvent.SLOT, "index": d.index, "logprobs": None,
                                "finish_reason": None}]})
                        yield event(d.text)
                        continue
                    lp = _logprobs_json(state.model, _generated(d.logprobs or [])) \
                        if logprobs is not None else None
                    flag = {"timed_out": True} if d.timed_out else {}
                    yield sse({**base, "choices": [{"text": d.text, "index": d.index,
                               "logprobs": lp, "finish_reason": d.finish_reason}], **flag})
            except APIError as exc:
                yield error_event(exc)
                return
            u = final_usage(request.scope, state.model_name, list(results.values()), n)
            if include_usage:
                yield sse({**base, "choices": [], "usage": u})
            yield DONE

        return sse_response(gen, chunks(), state.config.server.keepalive_seconds)

    results = await unless_disconnected(request, gen, collect(gen))
    choices = []
    for res in results:
        prefix = echoes[res.index // n]
        lp = None
        if logprobs is not None:
            pairs = _generated(res.logprobs)
            if echo:
                prompt = tokenized[res.index // n][0]
                pairs = [*zip(prompt, res.prompt_logprobs or [], strict=False), *pairs]
            lp = _logprobs_json(state.model, pairs)
        choices.append({"text": prefix + res.text, "index": res.index, "logprobs": lp,
                        "finish_reason": res.finish_reason})
    return JSONResponse({**base, "choices": choices, **timeout_flag(results),
                         "usage": final_usage(request.scope, state.model_name, results, n)})


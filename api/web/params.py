"""Validation of request bodies: typed getters that raise OpenAI-style 400s,
and the sampling fields shared by completions and chat completions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

from api.web.body import BodyLimits, decode_object, too_large
from api.web.errors import APIError, invalid
from api.web.session import note_session
from engine.config import LLAMA_CPP_SAMPLING, SamplingDefaults
from engine.request import SamplingParams

MAX_STOP = 16

T = TypeVar("T")


async def within(seconds: float, work: Awaitable[T]) -> T:
    """``asyncio.wait_for``, without the task it makes on Python 3.11 (one more turn of
    the event loop before every request's handler goes on)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await work
    return await asyncio.wait_for(work, seconds)  # pragma: no cover - Python 3.10


async def read_json(request: Request, limits: BodyLimits) -> dict[str, Any]:
    """Read the body (refusing it past ``max_bytes`` before it is all in memory) and
    decode it through ``api.web.body``, the one decoding path of every route."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and len(length) < 20 and \
            int(length) > limits.max_bytes:
        raise too_large(limits.max_bytes)
    raw = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():
            raw.extend(chunk)
            if len(raw) > limits.max_bytes:
                raise too_large(limits.max_bytes)

    try:
        await within(limits.timeout, receive())
    except asyncio.TimeoutError:
        raise APIError(f"Request body not received within {limits.timeout:g} s "
                       "(server.body_timeout)", status=408, code="body_timeout",
                       param="body_timeout") from None
    data = decode_object(bytes(raw), limits)
    note_session(request.scope, data)  # echoed as x-session-id (api.web.session)
    return data


class Body:
    """Typed access to a decoded JSON object; every mistake is a 400 naming the field."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def number(self, name: str, default: float, lo: float, hi: float) -> float:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(name, f"'{name}' must be a number, got {json.dumps(value)[:40]}")
        if not lo <= value <= hi:
            raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {value}")
        return float(value)

    def integer(self, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, f"'{name}' must be an integer, got {json.dumps(value)[:40]}")
        if value < lo or (hi is not None and value > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise invalid(name, f"'{name}' must be {bound}, got {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise invalid(name, f"'{name}' must be a boolean, got {json.dumps(value)[:40]}")
        return value

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise invalid(name, f"'{name}' must be a string")
        return value

    def obj(self, name: str) -> dict[str, Any] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid(name, f"'{name}' must be an object")
        return value

    def stop(self, limit: int = MAX_STOP) -> tuple[str, ...]:
        value = self.data.get("stop")
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise invalid("stop", "'stop' must be a string or a list of strings")
        if len(value) > limit:
            raise invalid("stop", f"'stop' may hold at most {limit} strings")
        return tuple(s for s in value if s)

    def logit_bias(self, n_vocab: int) -> tuple[tuple[int, float], ...]:
        value = self.obj("logit_bias")
        if not value:
            return ()
        out = []
        for key, bias in value.items():
            try:
                token = int(key)
            except ValueError:
                raise invalid("logit_bias", f"logit_bias key {key!r} is not a token id") from None
            if not 0 <= token < n_vocab:
                raise invalid("logit_bias", f"logit_bias token {token} is outside the vocabulary")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not (
                -100 <= bias <= 100
            ):
                raise invalid("logit_bias", "logit_bias values must be numbers in [-100, 100]")
            out.append((token, float(bias)))
        return tuple(out)


def choice_seed(seed: int, index: int) -> int:
    """A 32-bit seed per choice: choice 0 uses the seed itself; siblings are hashed,
    so seed s choice 1 never equals seed s+1 choice 0."""
    if index == 0 and 0 <= seed < 2**32:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def sampling(body: Body, *, n_vocab: int, defaults: SamplingDefaults = LLAMA_CPP_SAMPLING,
             max_tokens_field: str = "max_tokens", logprobs: int | None = None,
             prompt_logprobs: bool = False, max_stop: int = MAX_STOP) -> SamplingParams:
    """The request's sampling fields, each one it leaves out from ``defaults`` (the
    model's ``model.sampling``)."""
    max_tokens = body.integer(max_tokens_field, None, 1)
    if max_tokens_field != "max_tokens" and max_tokens is None:
        max_tokens = body.integer("max_tokens", None, 1)
    seed = body.integer("seed", None, -(2**63), 2**64 - 1)
    return SamplingParams(
        temperature=body.number("temperature", defaults.temperature, 0.0, 2.0),
        top_p=body.number("top_p", defaults.top_p, 0.0, 1.0),
        top_k=body.integer("top_k", defaults.top_k, 0) or 0,
        min_p=body.number("min_p", defaults.min_p, 0.0, 1.0),
        presence_penalty=body.number("presence_penalty", defaults.presence_penalty, -2.0, 2.0),
        frequency_penalty=body.number("frequency_penalty", defaults.frequency_penalty,
                                      -2.0, 2.0),
        repeat_penalty=body.number("repeat_penalty", defaults.repeat_penalty, 0.0, 10.0),
        seed=seed if seed is not None else secrets.randbits(32), seeded=seed is not None,
        logit_bias=body.logit_bias(n_vocab),
        max_tokens=max_tokens,
        stop=body.stop(max_stop),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        ignore_eos=body.boolean("ignore_eos", False),
        cache_prompt=body.boolean("cache_prompt", True),
    )

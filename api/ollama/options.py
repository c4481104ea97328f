"""Ollama's request fields that are not the conversation: ``options`` (sampling), ``format``,
``think``, ``keep_alive`` and ``stream``.

``options`` map onto the sampling fields of chat completions and are validated the same
way (a wrong type or range is a 400): ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``seed`` (negative: random), ``num_predict`` (→ ``max_tokens``; 0 or negative: no limit
but the context and ``model.max_output_tokens``), ``stop`` (up to 64), ``repeat_penalty``,
``repeat_last_n`` (-1: the whole context), ``presence_penalty``, ``frequency_penalty``.
``num_ctx`` must be a positive integer and is otherwise ignored: the context is the
server's (``model.n_ctx``). Every other option (``num_keep``, ``typical_p``, ``mirostat…``,
``num_gpu``, ``num_thread``, ``use_mmap`` …) is ignored, as Ollama ignores options it does
not know. Options left out take the server's defaults (those of the OpenAI routes).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from api.web.errors import APIError, invalid
from api.web.params import Body, sampling
from engine.config import LLAMA_CPP_SAMPLING, SamplingDefaults
from engine.request import SamplingParams

# option -> the chat-completions field it becomes (validated by api.web.params.sampling)
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "min_p": "min_p", "repeat_penalty": "repeat_penalty",
            "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "stop": "stop"}
# Ollama sets no limit; editor plugins send a stop string per template marker (Continue's
# autocomplete: ~20), more than the OpenAI routes' 16
MAX_STOP = 64
THINK_LEVELS = ("low", "medium", "high", "max")
# Go's time.ParseDuration: "5m", "1h30m", "-1s", "0" (and JSON numbers: seconds)
_DURATION = re.compile(r"[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+)")


def _integer(options: dict[str, Any], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)  # JSON clients write 128.0 for 128
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"options.{name}",
                      f"option '{name}' must be an integer, got {json.dumps(value)[:40]}")
    return value


def sampling_params(raw: Any, *, n_vocab: int, n_ctx: int,
                    defaults: SamplingDefaults = LLAMA_CPP_SAMPLING) -> SamplingParams:
    """``options`` → the request's sampling parameters (400 naming the option)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise invalid("options", "'options' must be an object")
    body: dict[str, Any] = {field: raw[name] for name, field in SAMPLING.items()
                            if raw.get(name) is not None}
    num_predict = _integer(raw, "num_predict")
    if num_predict is not None and num_predict > 0:
        body["max_tokens"] = num_predict
    seed = _integer(raw, "seed")
    if seed is not None and seed >= 0:
        body["seed"] = seed
    num_ctx = _integer(raw, "num_ctx")
    if num_ctx is not None and num_ctx < 1:
        raise invalid("options.num_ctx", "option 'num_ctx' must be a positive integer")
    last_n = _integer(raw, "repeat_last_n")
    if last_n is not None and last_n < -1:
        raise invalid("options.repeat_last_n", "option 'repeat_last_n' must be -1 (the "
                      "whole context), 0 (off) or a positive number of tokens")
    try:
        params = sampling(Body(body), n_vocab=n_vocab, defaults=defaults, max_stop=MAX_STOP)
    except APIError as exc:  # name the option, not the chat-completions field it became
        option = next((k for k, v in SAMPLING.items() if v == exc.param), exc.param)
        raise invalid(f"options.{option}", "option " + exc.message.replace(
            f"'{exc.param}'", f"'{option}'")) from None
    if last_n is not None:
        params = dataclasses.replace(params, penalty_last_n=n_ctx if last_n == -1
                                     else min(last_n, n_ctx))
    return params


def response_format(raw: Any) -> dict[str, Any] | None:
    """``format``: ``"json"`` (any JSON object) or a JSON schema → chat's ``response_format``
    (the same grammar path)."""
    if raw is None or raw == "":
        return None
    if raw == "json":
        return {"type": "json_object"}
    if isinstance(raw, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": raw}}
    raise invalid("format", "'format' must be \"json\" or a JSON schema object")


def think(raw: Any, *, supported: bool, model: str) -> dict[str, Any]:
    """``think`` → chat template arguments: ``enable_thinking`` (and ``reasoning_effort``
    for a level). Asking a model without reasoning to think is a 400, as in Ollama."""
    if raw is None:
        return {}
    if not isinstance(raw, bool) and raw not in THINK_LEVELS:
        raise invalid("think", "'think' must be true, false, \"low\", \"medium\", \"high\" or "
                      "\"max\"")
    if raw is not False and not supported:
        raise APIError(f"\"{model}\" does not support thinking", param="think")
    if isinstance(raw, bool):
        return {"enable_thinking": raw}
    return {"enable_thinking": True, "reasoning_effort": "high" if raw == "max" else raw}


def check_keep_alive(raw: Any) -> None:
    """``keep_alive`` is accepted (a duration string or seconds) and has no effect: models
    stay loaded as the server's config says (``server.model_idle_seconds``)."""
    if raw is None or (isinstance(raw, (int, float)) and not isinstance(raw, bool)):
        return
    if isinstance(raw, str) and _DURATION.fullmatch(raw.strip()):
        return
    raise invalid("keep_alive", f"'keep_alive' must be a duration such as \"5m\" or a number "
                  f"of seconds, got {json.dumps(raw)[:40]}")


def stream_flag(body: Body) -> bool:
    """Ollama streams unless ``stream`` is false."""
    return body.boolean("stream", True)

"""Tokens a grammar forces are taken without sampling (engine/drafts/forced.py), through a
real server on Qwen2.5-Coder-0.5B with the OpenAI SDK: answers still validate, every token
is still streamed and counted, logprobs still come for each, and the counter
``llamaserve_grammar_forced_tokens`` says forcing happened."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai import OpenAI

from conftest import ServerProcess

FORCED = "llamaserve_grammar_forced_tokens_total"
# long keys and enum values: after a key's opening quote the grammar allows one text only
SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "required": ["temperature_in_celsius", "weather_description", "recommended_clothing"],
    "properties": {
        "temperature_in_celsius": {"type": "integer", "minimum": -40, "maximum": 50},
        "weather_description": {"enum": ["partly cloudy with occasional showers",
                                         "sunny and unusually warm for the season"]},
        "recommended_clothing": {"type": "string", "maxLength": 40}}}
ASK = [{"role": "user", "content": "Describe the weather in Paris today as JSON."}]


@pytest.fixture(scope="module")
def client(qwen_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=qwen_server.base_url, api_key="unused", max_retries=0, timeout=120)


def forced(server: ServerProcess) -> float:
    return server.metrics().get(FORCED, 0.0)


def schema_format(schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "w", "schema": schema,
                                                   "strict": True}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_forced_tokens_answers_validate_and_stream_whole(qwen_server: ServerProcess,
                                                         client: OpenAI, seed: int) -> None:
    before = forced(qwen_server)
    kwargs: Any = {"model": "x", "messages": ASK, "max_tokens": 120, "temperature": 1.0,
                   "seed": seed, "response_format": schema_format(SCHEMA)}
    whole = client.chat.completions.create(**kwargs)
    after = forced(qwen_server)
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    # the keys' and the enum value's tails were forced, not sampled
    assert after - before >= 10, (before, after)
    assert whole.usage is not None
    # streamed, the same seed gives the same text, token by token, and the same count
    stream = client.chat.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        pieces += [c.delta.content or "" for c in chunk.choices]
    assert "".join(pieces) == choice.message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert forced(qwen_server) - after == after - before


def test_forced_tokens_have_logprobs(qwen_server: ServerProcess, client: OpenAI) -> None:
    before = forced(qwen_server)
    r = client.chat.completions.create(model="x", messages=ASK, max_tokens=120,
                                       temperature=0, logprobs=True, top_logprobs=2,
                                       response_format=schema_format(SCHEMA))
    assert forced(qwen_server) > before
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content is not None and r.usage is not None
    # every token has its entry (an end-of-generation token is counted, not shown)
    assert r.choices[0].finish_reason == "stop"
    assert len(content) == r.usage.completion_tokens - 1
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)


def test_a_forced_tool_call_is_one_valid_call(qwen_server: ServerProcess,
                                              client: OpenAI) -> None:
    tool = {"type": "function", "function": {
        "name": "report_the_weather_forecast", "strict": True, "parameters": SCHEMA}}
    before = forced(qwen_server)
    r = client.chat.completions.create(
        model="x", messages=ASK, max_tokens=160, temperature=0.7, seed=5, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "report_the_weather_forecast"}})
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "report_the_weather_forecast"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    assert forced(qwen_server) - before >= 10


# -- take_forced's bookkeeping, with the engine's parts reduced to what it calls ---------

class _Runner:
    def __init__(self, refuse_at: int) -> None:
        self.refuse_at, self.offered = refuse_at, 0

    def take_forced(self, sampler: object, token: int) -> bool:
        self.offered += 1
        return self.offered <= self.refuse_at


class _Delivery:
    def __init__(self) -> None:
        from engine.metrics import EngineMetrics
        self.metrics = EngineMetrics()

    def emit(self, r: Any, token: int, index: int, out: list[Any]) -> bool:
        r.output.append(token)
        return True


class _Cache:
    def __init__(self) -> None:
        self.trimmed: list[int] = []

    def trim(self, r: Any, n: int) -> None:
        self.trimmed.append(n)


@pytest.mark.parametrize("refuse_at", [0, 1, 2, 3])
def test_a_refused_forced_token_is_decoded_again_for_its_logits(refuse_at: int) -> None:
    """The grammar refuses the forced token at ``refuse_at`` (3: none refused): the tokens
    before it are kept, and the next step decodes the last kept one again (its logits were
    not read), as a plain decode step would: ``num_computed`` is prompt + output - 1."""
    from engine.drafts.forced import take_forced
    from engine.request import Request, SamplingParams, Status
    from engine.scheduler import BatchItem

    r = Request(prompt=[1, 2, 3], params=SamplingParams(), max_new_tokens=50)
    r.status, r.output = Status.RUNNING, [7]
    r.draft, r.forced = [8, 9, 10], 3
    item = BatchItem(r, [7, 8, 9, 10], 3, True, 3)
    r.num_computed = 3 + 4  # what the scheduler commits after the decode
    runner, delivery, cache = _Runner(refuse_at), _Delivery(), _Cache()
    goes_on = take_forced(item, 3, runner, delivery, cache, [])  # type: ignore[arg-type]
    assert r.output == [7, 8, 9, 10][:1 + refuse_at]
    assert goes_on == (refuse_at == 3)
    if refuse_at < 3:
        assert r.num_computed == len(r.prompt) + len(r.output) - 1 == cache.trimmed[-1]
    else:
        assert r.num_computed == len(r.prompt) + len(r.output) and not cache.trimmed

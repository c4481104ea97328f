"""The routes the OpenAI SDK calls beyond generation, through the SDK's own methods, on the
real Qwen2.5-Coder-0.5B: ``models.retrieve``, ``responses.input_items.list``,
``responses.input_tokens.count``, background responses (poll, cancel, ``kill -9`` of the
server and a restart on the same store), the Conversations API, and the Batch API on a
default start (no ``batch_dir`` in the config)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import ServerProcess, qwen_config, start_server
from engine.model_pull import default_batch_dir


def store_config(store: Path) -> dict[str, Any]:
    cfg = qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "responses_store_path": str(store)}
    return cfg


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("responses-store")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Iterator[ServerProcess]:
    # the Batch API's default store (~/.cache/llamaserve/batches/<port>), removed after
    s = start_server(store_config(store), tmp_path_factory.mktemp("routes"),
                     default_batch_dir=True)
    yield s
    s.stop()
    shutil.rmtree(default_batch_dir(s.port), ignore_errors=True)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def poll(client: OpenAI, response_id: str, until: tuple[str, ...],
         timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = client.responses.retrieve(response_id)
        if r.status in until or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


# -- models -------------------------------------------------------------------------------

def test_models_retrieve_returns_the_listed_entry(client: OpenAI) -> None:
    listed = client.models.list().data
    for entry in listed:
        got = client.models.retrieve(entry.id)
        assert got.model_dump() == entry.model_dump()
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.code == "model_not_found"


# -- input items and input tokens -----------------------------------------------------------

def test_input_items_list_the_input_of_each_input_shape(client: OpenAI) -> None:
    r = client.responses.create(input="Say hi.", max_output_tokens=4, temperature=0)
    (item,) = client.responses.input_items.list(r.id).data
    assert item.type == "message" and item.role == "user"  # type: ignore[union-attr]
    assert item.content[0].text == "Say hi."  # type: ignore[union-attr]
    assert item.id and item.status == "completed"  # type: ignore[union-attr]
    items: Any = [
        {"role": "system", "content": "Answer with one word."},
        {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                          "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": json.dumps({"city": "Paris"})},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "And so?"},
    ]
    r = client.responses.create(input=items, max_output_tokens=4, temperature=0)
    asc = client.responses.input_items.list(r.id, order="asc").data
    assert [x.type for x in asc] == ["message", "message", "function_call",
                                     "function_call_output", "message"]
    assert asc[2].call_id == "call_1" and asc[3].output == "sunny"  # type: ignore[union-attr]
    assert len({x.id for x in asc}) == 5
    desc = client.responses.input_items.list(r.id).data  # newest first, as OpenAI
    assert [x.id for x in desc] == [x.id for x in reversed(asc)]
    # pages of two, following `after`, walk the same five items
    page = client.responses.input_items.list(r.id, order="asc", limit=2)
    walked = [x.id for x in page.data]
    assert page.has_more
    while page.has_more:
        page = client.responses.input_items.list(r.id, order="asc", limit=2,
                                                 after=walked[-1])
        walked += [x.id for x in page.data]
    assert walked == [x.id for x in asc]
    # the SDK's auto-pagination too
    assert [x.id for x in client.responses.input_items.list(r.id, limit=1)] == \
        [x.id for x in desc]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_missing")
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(r.id, limit=1000)


def test_input_tokens_count_equals_the_prompt_a_response_uses(client: OpenAI) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "description": "Weather",
                   "parameters": {"type": "object", "properties": {
                       "city": {"type": "string"}}, "required": ["city"]}}]
    for kwargs in ({"input": "Count me."},
                   {"input": "What is the weather in Oslo?", "instructions": "Be brief.",
                    "tools": tools}):
        counted = client.responses.input_tokens.count(**kwargs)
        assert counted.object == "response.input_tokens"
        r = client.responses.create(max_output_tokens=1, temperature=0, **kwargs)
        assert r.usage is not None and counted.input_tokens == r.usage.input_tokens
    # with previous_response_id: the history counts too
    first = client.responses.create(input="Remember 7.", max_output_tokens=4, temperature=0)
    more = client.responses.input_tokens.count(input="And?", previous_response_id=first.id)
    alone = client.responses.input_tokens.count(input="And?")
    assert more.input_tokens > alone.input_tokens


# -- background responses -----------------------------------------------------------------

def test_background_response_is_polled_to_completion(client: OpenAI) -> None:
    r = client.responses.create(input="Count from 1 to 20.", background=True,
                                max_output_tokens=60, temperature=0)
    assert r.background is True and r.status in ("queued", "in_progress")
    assert r.output == []
    done = poll(client, r.id, ("completed", "incomplete", "failed"))
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.usage is not None and done.usage.output_tokens > 0
    # the same text as the same request answered in the foreground
    fg = client.responses.create(input="Count from 1 to 20.", max_output_tokens=60,
                                 temperature=0)
    assert done.output_text == fg.output_text
    assert client.responses.input_items.list(r.id).data[0].content[0].text == \
        "Count from 1 to 20."  # type: ignore[union-attr]


def test_background_needs_store_and_only_background_cancels(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(input="x", background=True, store=False)
    assert err.value.param == "background"
    fg = client.responses.create(input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(fg.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")


def generated(server: ServerProcess) -> float:
    return next(v for k, v in server.metrics().items()
                if k.startswith("llamaserve_generated_tokens") and not k.endswith("_created"))


def test_cancel_stops_the_generation_within_one_step(server: ServerProcess,
                                                     client: OpenAI) -> None:
    # ignore_eos: the run cannot end on its own before the cancel lands
    r = client.responses.create(input="Write a very long story about a ship.",
                                background=True, max_output_tokens=3000, temperature=0.8,
                                extra_body={"ignore_eos": True})
    poll(client, r.id, ("in_progress",))
    before = generated(server)
    time.sleep(0.5)
    assert generated(server) > before  # it is generating
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    at_cancel = generated(server)
    time.sleep(1.0)
    # the engine let the sequence go: at most the step in flight when the cancel landed
    assert generated(server) - at_cancel <= 1
    assert server.metrics().get("llamaserve_requests_running", 0) == 0
    stored = client.responses.retrieve(r.id)
    assert stored.status == "cancelled"
    # cancelling again answers the same response
    assert client.responses.cancel(r.id).model_dump() == stored.model_dump()


def test_background_stream_sends_the_events(server: ServerProcess) -> None:
    with httpx.stream("POST", f"{server.base_url}/responses", timeout=60, json={
            "input": "Say hello.", "background": True, "stream": True,
            "max_output_tokens": 8, "temperature": 0}) as reply:
        kinds = [json.loads(line[5:])["type"] for line in reply.iter_lines()
                 if line.startswith("data:")]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                           "response.incomplete")


@pytest.mark.parametrize("stop", ["kill -9", "graceful"])
def test_background_response_survives_its_server(tmp_path: Path, stop: str) -> None:
    """SIGKILL mid-answer, or a graceful stop (drain, shutdown): the next server on the
    store resumes the response; neither leaves it cancelled."""
    store = tmp_path / "store"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = start_server(store_config(store), tmp_path / "a")
    try:
        c = OpenAI(base_url=first.base_url, api_key="unused", max_retries=0, timeout=60)
        # 64 tokens: seconds of work left when the server stops, a few for the next
        r = c.responses.create(input="Count from 1 to 300, one number per line.",
                               background=True, max_output_tokens=64, temperature=0)
        poll(c, r.id, ("in_progress",))
    finally:
        if stop == "kill -9":
            first.proc.kill()  # SIGKILL: no shutdown, the run dies mid-answer
            first.proc.wait()
        else:
            first.stop()  # SIGTERM: drains, shuts down
    second = start_server(store_config(store), tmp_path / "b")
    try:
        c = OpenAI(base_url=second.base_url, api_key="unused", max_retries=0, timeout=60)
        done = poll(c, r.id, ("completed", "incomplete", "failed"), timeout=180)
        assert done.status in ("completed", "incomplete"), done.error
        assert done.id == r.id and done.created_at == r.created_at and done.output_text
        assert "resuming background response" in second.log()
    finally:
        second.stop()


# -- conversations --------------------------------------------------------------------------

def test_conversation_carries_the_history(client: OpenAI) -> None:
    conv = client.conversations.create(
        items=[{"type": "message", "role": "user",
                "content": "My cat is called Whiskers. Remember it."}],
        metadata={"topic": "cats"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "cats"}
    r = client.responses.create(conversation=conv.id, temperature=0, max_output_tokens=20,
                                input="What is my cat called? One word.")
    assert "Whiskers" in r.output_text
    assert r.conversation is not None and r.conversation.id == conv.id
    items = client.conversations.items.list(conv.id, order="asc").data
    assert [x.type for x in items] == ["message", "message", "message"]
    assert [x.role for x in items] == ["user", "user", "assistant"]  # type: ignore[union-attr]
    assert items[2].id == r.output[0].id
    # a second turn sees both earlier turns
    counted = client.responses.input_tokens.count(conversation=conv.id, input="Again?")
    alone = client.responses.input_tokens.count(input="Again?")
    assert counted.input_tokens > alone.input_tokens + 20
    # items: get, add, delete; metadata: update
    got = client.conversations.items.retrieve(items[0].id, conversation_id=conv.id)
    assert got.id == items[0].id
    added = client.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "user", "content": "An extra note."}])
    assert len(added.data) == 1
    assert len(client.conversations.items.list(conv.id).data) == 4
    client.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
    assert len(client.conversations.items.list(conv.id).data) == 3
    updated = client.conversations.update(conv.id, metadata={"topic": "pets"})
    assert updated.metadata == {"topic": "pets"}
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "pets"}
    deleted = client.conversations.delete(conv.id)
    assert deleted.deleted and deleted.id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(conversation=conv.id, input="x")


def test_conversation_refusals(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list("conv_missing")
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(items=[{"type": "message", "role": "robot",
                                            "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(metadata={f"k{i}": "v" for i in range(17)})
    conv = client.conversations.create()
    with pytest.raises(openai.BadRequestError):
        client.responses.create(conversation=conv.id, previous_response_id="resp_x",
                                input="x")
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve("msg_missing", conversation_id=conv.id)
    # a conversation is not a response, nor the reverse
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(conv.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(previous_response_id=conv.id, input="x")
    assert err.value.code == "previous_response_not_found"
    r = client.responses.create(input="x", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(r.id)


# -- the Batch API on a default start -------------------------------------------------------

def test_batch_api_is_on_by_default(client: OpenAI, server: ServerProcess) -> None:
    assert "batch_dir" not in json.dumps(qwen_config())
    store = Path(default_batch_dir(server.port))
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}}
    upload = client.files.create(file=("in.jsonl", json.dumps(line).encode()),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id
    out = json.loads(client.files.content(batch.output_file_id).text)
    assert out["custom_id"] == "a" and out["response"]["status_code"] == 200
    assert any(store.iterdir())  # kept in the default store, which survives restarts

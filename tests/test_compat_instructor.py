"""instructor against a real llamaserve on Qwen2.5-Coder-0.5B: every OpenAI mode with a model
holding a nested list of models and an enum (Pydantic emits `$defs` / `$ref` for it).

Settings a user needs: `instructor.from_openai(OpenAI(base_url=…/v1, api_key=<any>), mode=…)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from compat_models import ORDER_PROMPT, Item, Order, check_order
from conftest import COMPAT_MODEL, ServerProcess, require_library

instructor = require_library("instructor")
Mode = instructor.Mode

MODES = ["TOOLS", "TOOLS_STRICT", "FUNCTIONS", "JSON", "JSON_SCHEMA", "MD_JSON", "RESPONSES_TOOLS"]


@pytest.fixture(scope="module")
def openai_client(compat_qwen: ServerProcess) -> Iterator[OpenAI]:
    client = OpenAI(base_url=compat_qwen.base_url, api_key="unused", max_retries=0, timeout=180)
    yield client
    client.close()


def patched(client: OpenAI, mode: str) -> Any:
    return instructor.from_openai(client, mode=getattr(Mode, mode))


@pytest.mark.parametrize("mode", MODES)
def test_create_nested_model(openai_client: OpenAI, mode: str) -> None:
    order = patched(openai_client, mode).create(
        model=COMPAT_MODEL, response_model=Order, max_retries=0, temperature=0, max_tokens=200,
        messages=[{"role": "user", "content": ORDER_PROMPT}])
    check_order(order)


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_create_partial_streams_growing_objects(openai_client: OpenAI, mode: str) -> None:
    # strict=False: instructor validates each completed list item with strict=True by default,
    # and strict validation of a Python dict rejects the enum's string value ('red' is not
    # Color.red) — a client-side setting, independent of the server
    partials = list(patched(openai_client, mode).create_partial(
        model=COMPAT_MODEL, response_model=Order, max_retries=0, temperature=0, max_tokens=200,
        strict=False, messages=[{"role": "user", "content": ORDER_PROMPT}]))
    assert len(partials) > 1  # streamed, not one final object
    check_order(Order.model_validate(partials[-1].model_dump()))


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_create_iterable_yields_validated_items(openai_client: OpenAI, mode: str) -> None:
    items = list(patched(openai_client, mode).create_iterable(
        model=COMPAT_MODEL, response_model=Item, max_retries=0, temperature=0, max_tokens=200,
        messages=[{"role": "user", "content": "Extract every item: a red hat and a blue scarf."}]))
    assert items and all(isinstance(i, Item) and i.name for i in items)

"""Pydantic models shared by the client-compatibility tests (tests/test_compat_*.py).

Chosen so that each one exercises what the libraries really send: `Order` has a nested list
of models and an enum, so Pydantic emits `$defs` / `$ref` for it; `Weather` is flat.
Values are what Qwen2.5-Coder-0.5B reliably extracts from the prompts used with them.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Item(BaseModel):
    name: str = Field(description="the product name")
    color: Color


class Order(BaseModel):
    """An order placed by a customer."""

    customer: str = Field(description="the customer's first name")
    items: list[Item]


ORDER_PROMPT = "Alice ordered a red hat and a blue scarf. Extract the order."


class Weather(BaseModel):
    """Weather report for a city."""

    city: str
    temperature_c: int


WEATHER_PROMPT = "It is 21 degrees Celsius in Paris today. Extract the weather report."


class Location(BaseModel):
    city: str = Field(description="city name, e.g. Paris")
    country: str = Field(description="country name, e.g. France")


class GetWeather(BaseModel):
    """Get the current weather at a location."""

    location: Location


def check_order(order: Order) -> None:
    """The protocol result: a validated Order with at least one item (values not judged)."""
    assert isinstance(order, Order)
    assert order.customer and order.items
    assert all(isinstance(i.color, Color) and i.name for i in order.items)

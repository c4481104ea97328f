"""Which LoRA adapters a request runs under.

Adapters are loaded at start (``model.loras``). A request runs under the configured
scales unless its ``model`` names an adapter (that adapter is added, at its configured
scale or 1.0) or it sends llama-server's ``lora`` field, ``[{"id" | "name", "scale"}]``,
which sets the whole set for this request (adapters it leaves out are off).
"""

from __future__ import annotations

import math
from typing import Any

from api.web.errors import invalid
from api.web.params import Body
from engine.config import LoraConfig

Adapters = tuple[tuple[str, float], ...]


def adapter_scale(cfg: LoraConfig) -> float:
    """The scale a request naming the adapter as its model gets."""
    return cfg.scale if cfg.scale != 0 else 1.0


def request_adapters(body: Body, loaded: list[LoraConfig], default: Adapters) -> Adapters:
    by_name = {x.name: x for x in loaded}
    chosen = dict(default)
    model = body.data.get("model")
    if isinstance(model, str) and model in by_name:
        chosen[model] = adapter_scale(by_name[model])
    raw = body.data.get("lora")
    if raw is not None:
        chosen = _lora_field(raw, loaded)
    return tuple(sorted((name, scale) for name, scale in chosen.items() if scale != 0))


def _lora_field(raw: Any, loaded: list[LoraConfig]) -> dict[str, float]:
    if not isinstance(raw, list):
        raise invalid("lora", "'lora' must be a list of {\"id\" or \"name\", \"scale\"}")
    if raw and not loaded:
        raise invalid("lora", "this server has no LoRA adapters loaded (model.loras)")
    out: dict[str, float] = {}
    for i, item in enumerate(raw):
        where = f"lora[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "each entry must be an object with 'id' or 'name'")
        if "name" in item:
            name = item["name"]
            if not isinstance(name, str) or name not in {x.name for x in loaded}:
                known = ", ".join(x.name for x in loaded)
                raise invalid(f"{where}.name", f"unknown LoRA adapter {str(name)[:80]!r} "
                              f"(loaded: {known})", code="lora_not_found")
        elif "id" in item:
            index = item["id"]
            if isinstance(index, bool) or not isinstance(index, int) \
                    or not 0 <= index < len(loaded):
                raise invalid(f"{where}.id", f"unknown LoRA adapter id {str(index)[:40]} "
                              f"(ids 0..{len(loaded) - 1})", code="lora_not_found")
            name = loaded[index].name
        else:
            raise invalid(where, "each entry needs an 'id' or a 'name'")
        scale = item.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or abs(scale) > 100:
            raise invalid(f"{where}.scale", "'scale' must be a number between -100 and 100")
        out[name] = float(scale)
    return out

"""The HTTP side's plumbing: the Starlette app and its lifecycle, connections, the gate
(keys, limits, metrics), body decoding and parameters, errors, SSE streaming, the model
registry and per-model state, the asyncio bridge to a model's engine, the playground."""

"""Markers that are control tokens reach the response parser; other control tokens do not."""

from __future__ import annotations

from api.web.app import marker_tokens
from conftest import require_model
from engine.config import ModelConfig
from engine.core import Engine
from engine.handle import ModelHandle
from engine.runner import Runner
from parsers.response_schema import StreamLayout


def test_control_token_markers_are_rendered_for_the_parser() -> None:
    path = require_model("qwen-0.5b")
    cfg = ModelConfig(path=path, n_ctx=256, n_seq_max=1)
    runner = Runner(path, cfg)
    model = ModelHandle(Engine(runner, cfg))
    try:
        # <|im_start|> is a control token (empty text unless rendered as special);
        # <tool_call> is a user-defined token that is text anyway
        layout = StreamLayout(call_start="<|im_start|>", call_end="<tool_call>")
        vocab = runner.vocabulary
        (im_start,) = vocab.tokenize("<|im_start|>", add_special=False, parse_special=True)
        assert marker_tokens(model, layout) == frozenset({im_start})
        assert vocab.piece(im_start) == b"" and vocab.piece(im_start, True) == b"<|im_start|>"
        assert marker_tokens(model, StreamLayout()) == frozenset()
    finally:
        runner.close()

#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.10"
# dependencies = [
#   "llama-cpp-python>=0.3.36",
#   "starlette>=0.37",
#   "uvicorn>=0.30",
#   "jinja2>=3.1",
#   "jsonschema>=4.20",
#   "huggingface-hub>=0.23",
#   "numpy>=1.26",
#   "websockets>=12",
#   "prometheus-client>=0.20",
#   "h11>=0.14",
# ]
# ///
"""llamaserve: load the config, build the engine and the app, run uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING

from engine.config import ConfigError, load

if TYPE_CHECKING:
    from starlette.applications import Starlette


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OpenAI-compatible server over llama.cpp")
    parser.add_argument("-C", "--config", required=True, help="path to the JSON config")
    parser.add_argument("--host", help="override server.host")
    parser.add_argument("--port", type=int, help="override server.port")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as exc:
        print(f"llamaserve: config error: {exc}", file=sys.stderr)
        return 2
    level = config.server.log_level.upper()
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if config.server.log_file:
        handlers.append(logging.FileHandler(config.server.log_file))
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers)
    if level != "DEBUG":  # llama.cpp's own info lines only with log_level debug
        logging.getLogger("llamaserve.runner").setLevel(logging.WARNING)
    host = args.host or config.server.host
    if host not in ("127.0.0.1", "localhost", "::1") and not config.server.api_keys:
        logging.getLogger("llamaserve.server").warning(
            "binding to %s without an API key: anyone who can reach this port can use the "
            "model (set server.api_key, api_keys, api_key_env or api_key_file)", host)

    from api.app import build_app
    from api.lifecycle import Lifecycle, run
    from engine.core import Engine
    from engine.model_source import ModelSourceError, resolve
    from engine.runner import ModelLoadError, Runner

    def load_app() -> Starlette:
        try:
            path = resolve(config.model)
            draft_path = None
            if config.model.draft_model == "draft-model":
                draft_path = resolve(dataclasses.replace(
                    config.model, path=config.model.draft_model_path,
                    from_pretrained=config.model.draft_model_from_pretrained))
            runner = Runner(path, config.model)
            engine = Engine(runner, config.model, disk_cache=config.disk_cache,
                            draft_path=draft_path)
            return build_app(config, engine, manage_engine=False)
        except (ModelSourceError, ModelLoadError, ValueError, OSError) as exc:
            raise RuntimeError(str(exc)) from exc

    from api.connections import ConnectionLimits, guarded_protocol

    server = config.server
    http = guarded_protocol(ConnectionLimits(max_connections=server.max_connections,
                                             header_timeout=server.header_timeout,
                                             send_buffer=server.send_buffer_bytes))
    return run(Lifecycle(load_app), host, args.port or server.port, server.log_level,
               server.drain_timeout, http=http, timeout_keep_alive=server.keep_alive_timeout,
               ws_max_size=max(16 << 20, 2 * server.max_body_bytes))


if __name__ == "__main__":
    sys.exit(main())

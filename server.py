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
# ]
# ///
"""llamaserve: load the config, build the engine and the app, run uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.config import ConfigError, load


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
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":  # llama.cpp's own info lines only with log_level debug
        logging.getLogger("llamaserve.runner").setLevel(logging.WARNING)

    import uvicorn

    from api.app import build_app
    from engine.core import Engine
    from engine.model_source import ModelSourceError, resolve
    from engine.runner import ModelLoadError, Runner

    try:
        path = resolve(config.model)
        runner = Runner(path, config.model)
        app = build_app(config, Engine(runner, config.model, disk_cache=config.disk_cache))
    except (ModelSourceError, ModelLoadError, ValueError, OSError) as exc:
        print(f"llamaserve: cannot start: {exc}", file=sys.stderr)
        return 1
    uvicorn.run(app, host=args.host or config.server.host, port=args.port or config.server.port,
                log_level=config.server.log_level, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

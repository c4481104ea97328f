#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.10"
# dependencies = [
#   "llama-cpp-python>=0.3.36",
#   "starlette>=0.37",
#   "uvicorn>=0.30",
#   "jinja2>=3.1",
#   "jsonschema>=4.20",
#   "fqdn",
#   "idna",
#   "isoduration",
#   "jsonpointer>1.13",
#   "rfc3339-validator",
#   "rfc3986-validator>0.1.0",
#   "uri-template",
#   "webcolors>=24.6.0",
#   "huggingface-hub>=0.23",
#   "numpy>=1.26",
#   "websockets>=12",
#   "prometheus-client>=0.20",
#   "gguf>=0.10",
#   "h11>=0.14",
#   "httptools>=0.6",
#   "httpx>=0.27",
#   "python-multipart>=0.0.9",
#   "llguidance>=1.9",
# ]
# ///
"""llamaserve: load the config, build the engine and the app, run uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, ModelConfig, parse
from engine.config_flags import add_flags, config_data

if TYPE_CHECKING:
    from starlette.applications import Starlette


def check(argv: list[str]) -> int:
    """``llamaserve check -C config.json``: validate the config, find the model files and
    read their metadata through llama.cpp, without serving. Exit 0, 2 (config) or 1."""
    parser = argparse.ArgumentParser(prog="llamaserve check",
                                     description="validate a config and its model files")
    add_flags(parser)
    parser.add_argument("--offline", action="store_true",
                        help="no network (also HF_HUB_OFFLINE=1): Hub files missing from the "
                        "local cache are reported, not failed; the rest is checked")
    args = parser.parse_args(argv)
    offline = args.offline or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # huggingface_hub: the local cache only
    try:
        config = parse(config_data(args))
    except ConfigError as exc:
        print(f"llamaserve: config error: {exc}", file=sys.stderr)
        return 2
    from engine.backends.rpc import RpcError
    from engine.loading import ModelLoadError, model_summary
    from engine.model_source import ModelSourceError, resolve_file

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("llamaserve.runner").setLevel(logging.CRITICAL)
    models = []
    for m in config.all_models:
        models.append((f"model {m.served_name()}" if config.several else "model", m))
        if m.draft_model == "draft-model":
            models.append(("draft model", dataclasses.replace(
                m, path=m.draft_model_path, from_pretrained=m.draft_model_from_pretrained)))

    def local(what: str, path: str | None, source: Any, field: str) -> str | None:
        """The file's local path; offline, a Hub file not in the cache is reported (None)."""
        try:
            return resolve_file(path, source, field)
        except ModelSourceError:
            if not offline or source is None:
                raise
            print(f"{what}: {source.repo_id}/{source.filename}: not in the local cache "
                  "(fetched from the Hugging Face Hub at start; not checked offline)")
            return None

    templates: dict[int, str] = {}  # each served model's GGUF chat template
    try:
        for what, cfg in models:
            found = local(what, cfg.path, cfg.from_pretrained, "model.path")
            if found is not None:
                facts = ", ".join(f"{k} {v}" for k, v in model_summary(found).items())
                print(f"{what}: {found}: {facts}")
                template = gguf_template(found) if what.startswith("model") else None
                if template is not None:
                    templates[id(cfg)] = template
        for m in config.all_models:
            print(check_chat_setup(m, templates.get(id(m))))
            if m.mtmd is not None:
                from engine.media.projector import projector_inputs

                found = local(f"projector of {m.served_name()}", m.mtmd.mmproj_path,
                              m.mtmd.mmproj_from_pretrained, "model.mtmd.mmproj_path")
                if found is not None:
                    print(f"projector of {m.served_name()}: {found}: reads "
                          f"{projector_inputs(found)}")
            for lora in m.loras:
                found = local(f"LoRA adapter {lora.name}", lora.path, lora.from_pretrained,
                              "model.loras")
                if found is not None:
                    print(f"LoRA adapter {lora.name}: {found}: scale {lora.scale:g}")
            if m.rpc_servers:
                from engine.backends.rpc import hello, not_built_message, supports_rpc

                if not supports_rpc():
                    raise ModelLoadError(f"model.rpc_servers: {not_built_message()}")
                for endpoint in m.rpc_servers:
                    major, minor, patch = hello(endpoint)
                    print(f"RPC server {endpoint}: rpc-server protocol {major}.{minor}.{patch}")
    except (ModelSourceError, ModelLoadError, RpcError, ValueError) as exc:
        print(f"llamaserve: {exc}", file=sys.stderr)
        return 1
    print(f"config ok: serves {', '.join(m.served_name() for m in config.all_models)} on "
          f"{config.server.host}:{config.server.port}")
    return 0


def gguf_template(path: str) -> str | None:
    """The chat template a GGUF carries (None: none, or a header this reader cannot read:
    llama.cpp's own check above has the last word)."""
    from engine.gguf_file import read_header

    try:
        value = read_header(path).metadata.get("tokenizer.chat_template")
    except (OSError, ValueError, EOFError):
        return None
    return value if isinstance(value, str) else None


def check_chat_setup(m: ModelConfig, gguf_chat_template: str | None = None) -> str:
    """The config's own chat template and response schema (when it sets them): the
    template renders a conversation with a tool call and its result, and the schema gives
    the markers the parser and the grammars use; without a schema, the model family its
    template's markup is (``parsers/families.py``). Raises ValueError naming the field."""
    from parsers.chat_template import ChatTemplate, TemplateError
    from parsers.families import detect
    from parsers.response_schema import SchemaError, stream_layout

    name, said = m.served_name(), []
    if m.chat_template:
        template = ChatTemplate(m.chat_template)
        tools = [{"type": "function", "function": {"name": "f", "description": "F",
                                                   "parameters": {"type": "object", "properties": {
                                                       "a": {"type": "string"}}}}}]
        asked = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        called: list[dict[str, Any]] = [*asked, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": "x"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "R"}]
        try:
            template.render(called, tools=tools, add_generation_prompt=True)
            said.append("chat template renders a tool conversation")
        except TemplateError:  # a template without tool turns (Gemma 3's): a plain one
            try:
                template.render([asked[1]], add_generation_prompt=True)
            except TemplateError as exc:
                raise ValueError(f"model.chat_template of {name}: {exc}") from None
            said.append("chat template renders a conversation (it takes no tool turns)")
    if m.response_schema:
        try:
            layout = stream_layout(m.response_schema)
        except SchemaError as exc:
            raise ValueError(f"model.response_schema of {name}: {exc}") from None
        marks = [f"{a}...{b}" for a, b in ((layout.reasoning_start, layout.reasoning_end),
                                            (layout.call_start, layout.call_end)) if a and b]
        said.append("response schema reads " + (", ".join(marks) or "plain content"))
    elif m.chat_template or gguf_chat_template:
        source = m.chat_template or gguf_chat_template or ""
        family = detect(source)
        if family is not None:
            said.append(f"reasoning and tool calls read as the {family.name} family "
                        f"({family.models})")
        else:
            from parsers.template_probe import derive

            derived = derive(ChatTemplate(source))
            if derived.family is not None:
                lay = stream_layout(derived.family.schema)
                said.append("tool calls read from markup derived from its chat template "
                            f"(calls start with {lay.block_start or lay.call_start!r})")
            else:
                said.append(f"no tool-call markup known or derived ({derived.why}): "
                            "everything it writes is content (model.response_schema can "
                            "say it)")
    return f"{name}: " + ("; ".join(said) if said else "the GGUF's chat template (read at start)")


def enable_fault_handler(log_file: str | None) -> None:
    """A crash in native code (a segfault or an abort in llama.cpp) writes every thread's
    Python stack to the log before the process dies: the engine thread's names the step
    (decode, sampling, media), a prepare-pool thread's names the request stage (template,
    tokenizer, projector). The supervisor then restarts the process (docs/DEPLOY.md); the
    disk cache survives it."""
    import faulthandler

    if log_file:
        stream = open(log_file, "a")  # noqa: SIM115  (open for the life of the process)
        faulthandler.enable(stream, all_threads=True)
    else:
        faulthandler.enable(sys.stderr, all_threads=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pull"]:
        from engine.model_pull import main as pull

        return pull(argv[1:])
    if argv[:1] == ["check"]:
        return check(argv[1:])
    if argv[:1] == ["rpc-server"]:
        from engine.backends.rpc_server import main as rpc_server

        return rpc_server(argv[1:])
    parser = argparse.ArgumentParser(
        prog="llamaserve", description="OpenAI-compatible server over llama.cpp. "
        "Serve a model with 'llamaserve -m model.gguf' or a config with '-C config.json'; "
        "a flag and -C together: the flag wins.")
    add_flags(parser)
    args = parser.parse_args(argv)
    try:
        data = config_data(args)
        config = parse(data)
    except ConfigError as exc:
        print(f"llamaserve: config error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(data, indent=2))
        return 0
    level = config.server.log_level.upper()
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if config.server.log_file:
        handlers.append(logging.FileHandler(config.server.log_file))
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers)
    enable_fault_handler(config.server.log_file)
    if level != "DEBUG":  # llama.cpp's own info lines only with log_level debug
        logging.getLogger("llamaserve.runner").setLevel(logging.WARNING)
    host = config.server.host
    if host not in ("127.0.0.1", "localhost", "::1") and not config.server.api_keys:
        logging.getLogger("llamaserve.server").warning(
            "binding to %s without an API key: anyone who can reach this port can use the "
            "model (set server.api_key, api_keys, api_key_env or api_key_file)", host)


    if TYPE_CHECKING:
        from engine.handle import ModelHandle

    def load_model(cfg: ModelConfig) -> ModelHandle:
        """One model of the config: its files resolved, loaded, its engine built, and the
        handle the API holds it by."""
        from engine.core import Engine
        from engine.handle import ModelHandle
        from engine.model_source import resolve, resolve_file
        from engine.runner import Runner

        path = resolve(cfg)
        draft_path = None
        if cfg.draft_model == "draft-model":
            draft_path = resolve(dataclasses.replace(
                cfg, path=cfg.draft_model_path, from_pretrained=cfg.draft_model_from_pretrained))
        mmproj_path = None if cfg.mtmd is None else resolve_file(
            cfg.mtmd.mmproj_path, cfg.mtmd.mmproj_from_pretrained, "model.mtmd.mmproj_path")
        lora_paths = {x.name: resolve_file(x.path, x.from_pretrained, "model.loras")
                      for x in cfg.loras}
        runner = Runner(path, cfg)
        try:
            return ModelHandle(Engine(runner, cfg, disk_cache=config.disk_cache_for(cfg),
                                      draft_path=draft_path, mmproj_path=mmproj_path,
                                      lora_paths=lora_paths))
        except BaseException:
            runner.close()
            raise

    # the first model loads (in llama.cpp, without the GIL) while the HTTP side imports
    first: Future[ModelHandle] = Future()

    def load_first() -> None:
        try:
            first.set_result(load_model(config.model))
        except BaseException as exc:
            first.set_exception(exc)

    threading.Thread(target=load_first, name="llamaserve-load", daemon=True).start()

    from api.web.app import build_app
    from api.web.lifecycle import Lifecycle, run
    from engine.loading import ModelLoadError
    from engine.media.projector import ProjectorError
    from engine.model_pull import MODELS as PULLABLE
    from engine.model_source import ModelSourceError

    def load_app() -> Starlette:
        try:
            return build_app(config, first.result(), manage_engine=False,
                             load_model=load_model, pullable=tuple(PULLABLE))
        except (ModelSourceError, ModelLoadError, ProjectorError, ValueError, OSError) as exc:
            raise RuntimeError(str(exc)) from exc

    from api.web.connections import ConnectionLimits, guarded_protocol

    server = config.server
    http = guarded_protocol(ConnectionLimits(max_connections=server.max_connections,
                                             header_timeout=server.header_timeout,
                                             send_buffer=server.send_buffer_bytes))
    keepalive = server.keepalive_seconds or None  # WebSocket pings, like SSE comments
    return run(Lifecycle(load_app), host, server.port, server.log_level,
               server.drain_timeout, http=http, timeout_keep_alive=server.keep_alive_timeout,
               ws_max_size=max(16 << 20, 2 * server.max_body_bytes), ws_ping_interval=keepalive,
               ws_ping_timeout=max(20.0, keepalive or 0))


if __name__ == "__main__":
    sys.exit(main())

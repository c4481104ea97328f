"""Command-line flags that stand for config fields, so a model can be served with no
config file (``llamaserve -m model.gguf``) and a file's settings can be overridden.

Every flag names the config field it sets; with ``-C`` too, the flag wins.
``--print-config`` prints the resulting JSON config, to graduate to a file.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import ConfigError, expand_path, read


def _template_file(path: str) -> str:
    try:
        return Path(expand_path(path)).read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"--chat-template-file: cannot read {path}: "
                          f"{exc.strerror or exc}") from None


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    field: str  # "section.name"
    kind: Callable[[str], Any] = str
    help: str = ""
    load: Callable[[Any], Any] | None = None  # turns the flag's value into the field's

    @property
    def dest(self) -> str:
        return self.field.replace(".", "__")


FLAGS = (
    Flag(("-m", "--model"), "model.path", str, "GGUF file to serve"),
    Flag(("-a", "--alias"), "model.alias", str, "the model id clients see"),
    Flag(("--host",), "server.host", str, "address to bind"),
    Flag(("--port",), "server.port", int, "TCP port"),
    Flag(("-c", "--ctx-size"), "model.n_ctx", int, "KV cache cells (context)"),
    Flag(("-np", "--parallel"), "model.n_seq_max", int, "concurrent sequences"),
    Flag(("-b", "--batch-size"), "model.n_batch", int, "tokens per engine step"),
    Flag(("-t", "--threads"), "model.threads", int, "decode threads"),
    Flag(("-tb", "--threads-batch"), "model.threads_batch", int, "prefill threads"),
    Flag(("-ngl", "--n-gpu-layers"), "model.n_gpu_layers", int, "layers on the GPU"),
    Flag(("--rpc",), "model.rpc_servers", str, "comma-separated host:port of rpc-servers",
         lambda v: [s.strip() for s in v.split(",") if s.strip()]),
    Flag(("--api-key",), "server.api_key", str, "require this key"),
    Flag(("--chat-template-file",), "model.chat_template", str,
         "Jinja chat template file", _template_file),
    Flag(("--log-level",), "server.log_level", str, "critical, error, warning, info, debug"),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-C", "--config", help="JSON config file (flags override its fields)")
    for flag in FLAGS:
        parser.add_argument(*flag.names, dest=flag.dest, type=flag.kind,
                            metavar=flag.field.rsplit(".", 1)[1].upper(),
                            help=f"{flag.help} ({flag.field})")
    parser.add_argument("--print-config", action="store_true",
                        help="print the JSON config these arguments make, and exit")


def config_data(args: argparse.Namespace) -> dict[str, Any]:
    """The config document: ``-C``'s (or an empty one), with every given flag applied."""
    if args.config:
        data = read(args.config)
        if not isinstance(data, dict):
            raise ConfigError(f"{args.config}: a config is a JSON object")
        data = copy.deepcopy(data)
    elif getattr(args, FLAGS[0].dest) is None:
        raise ConfigError("give a model (-m model.gguf) or a config file (-C config.json)")
    else:
        data = {}
    for flag in FLAGS:
        value = getattr(args, flag.dest)
        if value is None:
            continue
        section, name = flag.field.split(".")
        if section == "model" and isinstance(data.get("models"), list):
            if flag.field in ("model.path", "model.alias"):
                raise ConfigError(f"{flag.names[-1]}: the config has a 'models' list; "
                                  "name each model's file and alias there")
            for m in data["models"]:  # a runtime flag applies to every model
                if isinstance(m, dict):
                    m[name] = flag.load(value) if flag.load else value
            continue
        part = data.setdefault(section, {})
        if not isinstance(part, dict):
            raise ConfigError(f"{section}: must be an object")
        if flag.field == "model.path":
            part.pop("from_pretrained", None)  # -m replaces the file's model source
        part[name] = flag.load(value) if flag.load else value
    if "models" not in data:
        data.setdefault("model", {})
    return data

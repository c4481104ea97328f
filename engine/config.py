"""Load and validate the JSON config into frozen dataclasses.

Validation runs against ``config.schema.json``; every problem is reported as a
``ConfigError`` whose message names the JSON path (``model.n_ctxx: unknown field``).
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from engine.model_pull import default_batch_dir


class ConfigError(ValueError):
    """A config problem, with the JSON path of the offending field in the message."""


@dataclass(frozen=True)
class FromPretrained:
    repo_id: str
    filename: str
    additional_files: tuple[str, ...] = ()
    cache_dir: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    prepare_workers: int = 4
    responses_store_max: int = 1000  # stored Responses API responses (count)
    responses_store_max_bytes: int = 64 * 1024 * 1024
    responses_store_ttl: float = 3600.0  # seconds; 0 keeps them until evicted
    responses_store_path: str | None = None  # a directory replicas share (None: in memory)
    websocket_history: int = 32  # responses a WebSocket connection can continue from
    api_keys: tuple[str, ...] = ()  # from api_key / api_keys / api_key_env / api_key_file
    metrics_auth: bool = False  # /metrics needs the API key too
    cors: CorsConfig | None = None
    max_queue: int = 256  # sequences waiting beyond the running ones; more get 429
    request_timeout: float = 0.0  # seconds per request; 0 = off
    rate_limit: int = 0  # requests per minute per API key (or client address); 0 = off
    log_file: str | None = None
    drain_timeout: float = 30.0  # seconds SIGTERM/SIGINT wait for in-flight requests
    reasoning_key: str | None = None  # seals Responses reasoning (else $LLAMASERVE_REASONING_KEY)
    keepalive_seconds: float = 10.0  # SSE comment when a stream is silent this long; 0 = off
    # the chat completion field of an answer's reasoning: "reasoning_content" (llama-server,
    # DeepSeek), "reasoning" (vLLM, OpenRouter) or "both"
    reasoning_field: str = "reasoning_content"
    playground: bool = True  # the chat page at /
    clamp_max_tokens: bool = True  # max_tokens past the room left is cut (false: a 400)
    max_json_depth: int = 64  # nesting of arrays/objects in a body or WebSocket frame
    max_string_length: int = 4 * 1024 * 1024  # characters of one JSON string
    max_array_length: int = 262_144  # items of one array (members of one object)
    max_number_length: int = 100  # characters of one number literal
    max_buffered_steps: int = 1024  # output steps held for a client not reading; then cancel
    max_connections: int = 1024  # open HTTP + WebSocket connections; more get 503
    header_timeout: float = 10.0  # seconds for a request's headers (slowloris)
    body_timeout: float = 30.0  # seconds for a request's body
    keep_alive_timeout: float = 5.0  # seconds an idle keep-alive connection stays open
    send_buffer_bytes: int | None = None  # SO_SNDBUF per connection; None = OS autotuning
    engine_failure_exit: float | None = 2.0  # exit 1 this long after the engine dies
    max_loaded_models: int = 0  # models loaded at once (LRU unloaded first); 0 = no limit
    max_loaded_bytes: int = 0  # weights + KV of loaded models; 0 = no limit
    model_idle_seconds: float = 0.0  # unload a model unused this long; 0 = never
    batch_api: bool = True  # the Batch API (api/batch); off: batch_dir is None
    batch_dir: str | None = None  # its store, one process each (<cache>/batches/<port>)
    batch_max_bytes: int = 10 * 1024**3  # uploads + results in batch_dir
    batch_file_max_bytes: int = 200 * 1024**2  # one upload
    batch_max_lines: int = 50_000  # requests in one batch input file
    batch_retention: float = 30 * 86400.0  # seconds files / finished batches stay; 0 = forever
    batch_max_inflight: int = 0  # batch lines running at once; 0 = the model's sequences
    batch_max_queued_lines: int = 0  # lines of one API key's active batches; 0 = no limit


@dataclass(frozen=True)
class CorsConfig:
    allow_origins: tuple[str, ...] = ()
    allow_methods: tuple[str, ...] = ("GET", "POST", "DELETE", "OPTIONS")
    allow_headers: tuple[str, ...] = ("Authorization", "Content-Type")
    allow_credentials: bool = False


@dataclass(frozen=True)
class EmbeddingCacheConfig:
    path: str
    max_bytes: int = 1 << 30


@dataclass(frozen=True)
class MtmdConfig:
    """``model.mtmd``: a multimodal projector and how media are loaded."""

    mmproj_path: str | None = None
    mmproj_from_pretrained: FromPretrained | None = None
    embedding_cache: EmbeddingCacheConfig | None = None
    memory_cache_bytes: int = 256 * 1024 * 1024
    image_max_bytes: int = 20 * 1024 * 1024
    audio_max_bytes: int = 100 * 1024 * 1024
    image_timeout_seconds: float = 10.0
    image_max_pixels: int = 4096 * 4096  # claimed by the header, checked before decoding
    audio_max_seconds: float = 3600.0  # claimed by a WAV / FLAC header, checked likewise
    allowed_media_domains: tuple[str, ...] | None = None  # exact host names; None = any
    allowed_local_media_path: str | None = None  # file: URLs only below this root
    allow_private_media_addresses: bool = False  # loopback / private hosts (trusted networks)
    allowed_private_media_networks: tuple[str, ...] = ()  # CIDRs allowed although private
    max_media_per_request: int = 16
    threads: int | None = None  # projector threads (default: model.threads)


@dataclass(frozen=True)
class SamplingDefaults:
    """``model.sampling``: what a request that leaves a sampling field out gets. The
    defaults are llama.cpp's (llama-server's); a model card's recommended settings go here
    (Qwen2.5-Coder: temperature 0.7, top_p 0.8, top_k 20, repeat_penalty 1.05). top_k
    bounds the work per token: a full-vocabulary softmax costs ~2 ms on a 262k vocabulary."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0


LLAMA_CPP_SAMPLING = SamplingDefaults()


@dataclass(frozen=True)
class LoraConfig:
    """One of ``model.loras``: an adapter loaded at start."""

    name: str
    path: str | None = None
    from_pretrained: FromPretrained | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None
    from_pretrained: FromPretrained | None = None
    alias: str | None = None
    chat_template: str | None = None
    response_schema: dict[str, Any] | None = None
    reject_token_id_inputs: bool = False  # /v1/embeddings refuses token-id inputs
    n_ctx: int = 4096
    n_seq_max: int = 4
    n_batch: int = 512
    n_ubatch: int = 512
    prefill_chunk: int = 0  # prompt tokens per step while others generate; 0 = n_batch
    # with sequences generating, a step may take this many times their decode-only step
    # (measured); prefill tokens are sized to fit, at most prefill_chunk; 0 = off
    prefill_step_target: float = 2.0
    threads: int = field(default_factory=lambda: os.cpu_count() or 4)
    threads_batch: int | None = None
    kv_unified: bool | None = None  # one KV pool (None, True) or n_ctx split per sequence
    swa_full: bool = False
    backend_sampling: bool = False  # llama.cpp samples in its graph (engine.sampling.backend)
    # recurrent / hybrid models: RAM for recurrent-state snapshots at message ends, so a
    # prompt sharing part of a cached sequence resumes there (0 = off)
    state_snapshots_max_bytes: int = 256 << 20
    # one KV pool: RAM for idle sequences moved out of it (engine.caches.parked; 0 = off)
    parked_max_bytes: int = 1 << 30
    embedding: bool | None = None
    pooling_type: int | None = None
    store_logits: bool = False
    use_mmap: bool = True
    use_mlock: bool = False
    n_gpu_layers: int | None = None
    split_mode: int | None = None
    main_gpu: int | None = None
    tensor_split: tuple[float, ...] | None = None
    rpc_servers: tuple[str, ...] = ()  # host:port of llama.cpp rpc-servers holding layers
    flash_attn: bool | str | None = None
    offload_kqv: bool | None = None
    op_offload: bool | None = None
    type_k: str | None = None
    type_v: str | None = None
    max_output_tokens: int | None = None
    seed: int | None = None
    draft_model: str | None = None  # "prompt-lookup-decoding", "draft-model", "draft-mtp"
    draft_model_num_pred_tokens: int | None = None  # longest draft (64 lookup, 6 model)
    draft_model_max_ngram_size: int = 6  # prompt lookup: longest n-gram matched
    draft_model_path: str | None = None
    draft_model_from_pretrained: FromPretrained | None = None
    draft_model_threads: int | None = None
    draft_model_threads_batch: int | None = None
    draft_model_min_p: float = 0.0  # draft model: stop a draft below this probability
    mtmd: MtmdConfig | None = None
    loras: tuple[LoraConfig, ...] = ()
    sampling: SamplingDefaults = LLAMA_CPP_SAMPLING
    # thinking budgets in tokens: "default", and per reasoning_effort ("minimal", "low",
    # "medium", "high"); a request's own budget wins (api.chat.prepare)
    reasoning_budget: tuple[tuple[str, int], ...] = ()

    @property
    def draft_max_tokens(self) -> int:
        """Longest draft per sequence and step (0 without drafting)."""
        if self.draft_model is None:
            return 0
        default = 64 if self.draft_model == "prompt-lookup-decoding" else 6
        return self.draft_model_num_pred_tokens or default

    @property
    def n_threads_batch(self) -> int:
        return self.threads_batch if self.threads_batch is not None else self.threads

    def served_name(self) -> str:
        """The model id clients see: the alias, else the file name (never a full path)."""
        if self.alias:
            return self.alias
        if self.from_pretrained is not None:
            return self.from_pretrained.repo_id
        return Path(self.path or "model").stem


@dataclass(frozen=True)
class DiskCacheConfig:
    path: str
    max_bytes: int = 1 << 30
    min_tokens: int = 128


@dataclass(frozen=True)
class Config:
    model: ModelConfig  # the first (default) model
    server: ServerConfig = field(default_factory=ServerConfig)
    disk_cache: DiskCacheConfig | None = None
    models: tuple[ModelConfig, ...] = ()  # every model served; () = just ``model``
    several: bool = False  # a ``models`` list: requests are routed by their model field

    @property
    def all_models(self) -> tuple[ModelConfig, ...]:
        return self.models or (self.model,)

    def disk_cache_for(self, model: ModelConfig) -> DiskCacheConfig | None:
        """Each model of a ``models`` list keeps its disk cache in its own subdirectory."""
        if self.disk_cache is None or not self.several:
            return self.disk_cache
        return replace(self.disk_cache, path=os.path.join(self.disk_cache.path,
                                                          model.served_name().replace("/", "_")))


@cache
def schema() -> dict[str, Any]:
    text = resources.files("engine").joinpath("config.schema.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _json_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _json_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(k for k in error.instance if k not in allowed)
        prefix = f"{where}." if error.absolute_path else ""
        return "; ".join(f"{prefix}{k}: unknown field" for k in unknown)
    if error.validator == "required":
        return f"{where}: {error.message}"
    if error.validator in ("oneOf", "anyOf", "enum", "const"):
        return f"{where}: invalid value {json.dumps(error.instance)[:80]}"
    return f"{where}: {error.message}"


def validate(data: Any) -> None:
    """Raise ConfigError for the first (most specific) schema violation."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        deepest = max(errors, key=lambda e: len(e.absolute_path))
        raise ConfigError(_describe(deepest))


def expand_path(value: str) -> str:
    return os.path.expandvars(os.path.expanduser(value))


def _from_pretrained(data: dict[str, Any] | None) -> FromPretrained | None:
    if data is None:
        return None
    return FromPretrained(
        repo_id=data["repo_id"],
        filename=data["filename"],
        additional_files=tuple(data.get("additional_files", ())),
        cache_dir=expand_path(data["cache_dir"]) if data.get("cache_dir") else None,
        revision=data.get("revision"),
    )


def _model(data: dict[str, Any], at: str = "model") -> ModelConfig:
    if ("path" in data) == ("from_pretrained" in data):
        raise ConfigError(f"{at}: set exactly one of 'path' or 'from_pretrained'")
    if data.get("n_ubatch", 0) > data.get("n_batch", ModelConfig.n_batch):
        raise ConfigError(f"{at}.n_ubatch: must not exceed {at}.n_batch")
    if 0 < data.get("prefill_step_target", 0) <= 1:
        raise ConfigError(f"{at}.prefill_step_target: must be more than 1 (a step with "
                          "prompt tokens takes longer than one without), or 0 for off")
    values = {k: v for k, v in data.items() if k in ModelConfig.__dataclass_fields__}
    template = data.get("chat_template")
    if isinstance(template, list):
        values["chat_template"] = "".join(template)
    if "path" in data:
        values["path"] = expand_path(data["path"])
    values["from_pretrained"] = _from_pretrained(data.get("from_pretrained"))
    if "tensor_split" in data:
        values["tensor_split"] = tuple(float(x) for x in data["tensor_split"])
    values["rpc_servers"] = _rpc_servers(data.get("rpc_servers", []), f"{at}.rpc_servers")
    if "draft_model_path" in data:
        values["draft_model_path"] = expand_path(data["draft_model_path"])
    values["draft_model_from_pretrained"] = _from_pretrained(
        data.get("draft_model_from_pretrained"))
    if data.get("draft_model") == "draft-model" and ("draft_model_path" in data) == (
            "draft_model_from_pretrained" in data):
        raise ConfigError(f"{at}.draft_model: 'draft-model' needs exactly one of "
                          "'draft_model_path' or 'draft_model_from_pretrained'")
    values["mtmd"] = _mtmd(data["mtmd"], f"{at}.mtmd") if "mtmd" in data else None
    values["loras"] = _loras(data.get("loras", []), f"{at}.loras")
    values["sampling"] = SamplingDefaults(**data.get("sampling", {}))
    values["reasoning_budget"] = tuple(sorted(data.get("reasoning_budget", {}).items()))
    return ModelConfig(**values)


def _rpc_servers(items: list[str], at: str = "model.rpc_servers") -> tuple[str, ...]:
    """``host:port`` endpoints as llama.cpp's RPC client reads them: a host name or IPv4
    address (it connects over IPv4), a colon, a port."""
    out: list[str] = []
    for i, item in enumerate(items):
        host, sep, port = item.rpartition(":")
        if not sep or not host or ":" in host or any(c.isspace() for c in host) \
                or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(f"{at}[{i}]: expected host:port (a host name or IPv4 address "
                              f"and a port 1-65535), got {item!r}")
        endpoint = f"{host}:{int(port)}"
        if endpoint in out:
            raise ConfigError(f"{at}[{i}]: {endpoint!r} is listed twice")
        out.append(endpoint)
    return tuple(out)


def _mtmd(data: dict[str, Any], at: str = "model.mtmd") -> MtmdConfig:
    if ("mmproj_path" in data) == ("mmproj_from_pretrained" in data):
        raise ConfigError(f"{at}: set exactly one of 'mmproj_path' or "
                          "'mmproj_from_pretrained'")
    values = {k: v for k, v in data.items() if k in MtmdConfig.__dataclass_fields__}
    if "mmproj_path" in data:
        values["mmproj_path"] = expand_path(data["mmproj_path"])
    values["mmproj_from_pretrained"] = _from_pretrained(data.get("mmproj_from_pretrained"))
    cache = data.get("embedding_cache")
    if cache is not None:
        values["embedding_cache"] = EmbeddingCacheConfig(
            **{**cache, "path": expand_path(cache["path"])})
    if "allowed_media_domains" in data:
        values["allowed_media_domains"] = tuple(
            h.lower().rstrip(".") for h in data["allowed_media_domains"])
    if "allowed_private_media_networks" in data:
        nets = []
        for i, cidr in enumerate(data["allowed_private_media_networks"]):
            try:
                nets.append(str(ipaddress.ip_network(cidr, strict=False)))
            except ValueError:
                raise ConfigError(f"{at}.allowed_private_media_networks[{i}]: not a "
                                  f"network: {cidr!r}") from None
        values["allowed_private_media_networks"] = tuple(nets)
    if "allowed_local_media_path" in data:
        root = Path(expand_path(data["allowed_local_media_path"]))
        if not root.is_dir():
            raise ConfigError(f"{at}.allowed_local_media_path: not a directory: "
                              f"{root}")
        values["allowed_local_media_path"] = str(root.resolve())
    return MtmdConfig(**values)


def _loras(items: list[dict[str, Any]], at: str = "model.loras") -> tuple[LoraConfig, ...]:
    out: list[LoraConfig] = []
    for i, item in enumerate(items):
        where = f"{at}[{i}]"
        if ("path" in item) == ("from_pretrained" in item):
            raise ConfigError(f"{where}: set exactly one of 'path' or 'from_pretrained'")
        source = item.get("path") or item["from_pretrained"]["filename"]
        name = item.get("name") or Path(source).stem
        if any(o.name == name for o in out):
            raise ConfigError(f"{where}.name: two adapters are called {name!r}; "
                              "give one a 'name'")
        out.append(LoraConfig(
            name=name, path=expand_path(item["path"]) if "path" in item else None,
            from_pretrained=_from_pretrained(item.get("from_pretrained")),
            scale=float(item.get("scale", 1.0))))
    return tuple(out)


def _api_keys(data: dict[str, Any]) -> tuple[str, ...]:
    """Keys from the config itself, an environment variable, or a file (one per line)."""
    keys = list(data.get("api_keys", []))
    if data.get("api_key"):
        keys.append(data["api_key"])
    if data.get("api_key_env"):
        value = os.environ.get(data["api_key_env"])
        if not value:
            raise ConfigError(f"server.api_key_env: environment variable {data['api_key_env']} "
                              "is not set")
        keys.extend(k.strip() for k in value.split(",") if k.strip())
    if data.get("api_key_file"):
        path = expand_path(data["api_key_file"])
        try:
            lines = Path(path).read_text("utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"server.api_key_file: cannot read {path}: "
                              f"{exc.strerror or exc}") from None
        keys.extend(line.strip() for line in lines if line.strip() and not line.startswith("#"))
    return tuple(keys)


def _server(data: dict[str, Any]) -> ServerConfig:
    values = {k: v for k, v in data.items() if k in ServerConfig.__dataclass_fields__}
    values["api_keys"] = _api_keys(data)
    if "cors" in data:
        cors: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                for k, v in data["cors"].items()}
        values["cors"] = CorsConfig(**cors)
    for key in ("log_file", "responses_store_path", "batch_dir"):  # paths: ~ expanded
        if data.get(key):
            values[key] = expand_path(data[key])
    if not data.get("batch_dir") and data.get("batch_api", True):  # on: a store per port
        values["batch_dir"] = default_batch_dir(values.get("port", ServerConfig.port))
    if values.get("batch_file_max_bytes", 0) > values.get("batch_max_bytes", 10 * 1024**3):
        raise ConfigError("server.batch_file_max_bytes: larger than server.batch_max_bytes "
                          "(an upload could never fit)")
    return ServerConfig(**values)


def parse(data: Any) -> Config:
    """Validate a decoded JSON document and build the Config."""
    if isinstance(data, dict) and ("model" in data) == ("models" in data):
        raise ConfigError("<root>: 'model' is a required property (or a 'models' list, "
                          "not both)")
    validate(data)
    server = _server(data.get("server", {}))
    several = "models" in data
    models = tuple(_model(m, f"models[{i}]") for i, m in enumerate(data["models"])) \
        if several else (_model(data["model"]),)
    _check_names(models)
    model = models[0]
    disk = data.get("disk_cache")
    disk_cache = None
    if disk is not None:
        disk_cache = DiskCacheConfig(**{**disk, "path": expand_path(disk["path"])})
    return Config(model=model, server=server, disk_cache=disk_cache,
                  models=models if several else (), several=several)


def _check_names(models: tuple[ModelConfig, ...]) -> None:
    """Every model id (alias) and adapter name routes one way."""
    seen: dict[str, str] = {}
    for i, m in enumerate(models):
        at = f"models[{i}]" if len(models) > 1 else "model"
        for name, what in [(m.served_name(), f"{at}.alias"),
                           *[(x.name, f"{at}.loras") for x in m.loras]]:
            if name in seen:
                raise ConfigError(f"{what}: {name!r} is already the name of {seen[name]}; "
                                  "give one an alias / name")
            seen[name] = what


def read(path: str | os.PathLike[str]) -> Any:
    """The decoded JSON document of a config file, not yet validated."""
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                          f"{exc.msg}") from None


def load(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file; every failure is a one-line ConfigError."""
    return parse(read(path))

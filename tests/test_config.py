"""Config validation: every mistake names its JSON path; the server exits 2 with one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import ConfigError, load, parse
from engine.loading import kv_unified

ROOT = Path(__file__).resolve().parent.parent


def model(**fields: object) -> dict[str, object]:
    return {"model": {"path": "/models/x.gguf", **fields}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (model(n_ctxx=4), "model.n_ctxx: unknown field"),
        ({**model(), "severr": {}}, "severr: unknown field"),
        ({**model(), "server": {"prot": 1}}, "server.prot: unknown field"),
        (model(n_ctx="big"), "model.n_ctx: 'big' is not of type 'integer'"),
        (model(n_seq_max=0), "model.n_seq_max: 0 is less than the minimum of 1"),
        (model(type_k="q9"), "model.type_k: invalid value"),
        (model(chat_template=3), "model.chat_template: invalid value"),
        (model(from_pretrained={"repo_id": "a/b"}), "model.from_pretrained: 'filename' is a "
                                                    "required property"),
        ({"server": {}}, "<root>: 'model' is a required property"),
        ({"model": {}}, "model: set exactly one of 'path' or 'from_pretrained'"),
        (model(mtmd={}), "model.mtmd: set exactly one of 'mmproj_path' or "
                         "'mmproj_from_pretrained'"),
        (model(mtmd={"mmproj_path": "x", "image_max_byte": 1}),
         "model.mtmd.image_max_byte: unknown field"),
        (model(mtmd={"mmproj_path": "x", "allowed_local_media_path": "/nonexistent/dir"}),
         "model.mtmd.allowed_local_media_path: not a directory"),
        (model(loras=[{"scale": 1}]), "model.loras[0]: set exactly one of 'path' or "
                                      "'from_pretrained'"),
        (model(loras=[{"path": "a/x.gguf"}, {"path": "b/x.gguf"}]),
         "model.loras[1].name: two adapters are called 'x'"),
        (model(loras=[{"path": "a.gguf", "sacle": 1}]), "model.loras[0].sacle: unknown field"),
        (model(n_batch=64, n_ubatch=128), "model.n_ubatch: must not exceed model.n_batch"),
        (model(sampling={"temprature": 0}), "model.sampling.temprature: unknown field"),
        (model(sampling={"top_p": 2}), "model.sampling.top_p: 2 is greater than the maximum"),
        (model(sampling={"top_k": 2**40}), "model.sampling.top_k: 1099511627776 is greater"),
        ({**model(), "disk_cache": {"path": "/tmp/x", "max_bytes": -1}},
         "disk_cache.max_bytes: -1 is less than the minimum of 0"),
    ],
)
def test_invalid_configs_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(data)
    assert message in str(err.value)


def test_defaults_and_template_array() -> None:
    cfg = parse(model(chat_template=["{{ a }}", "{{ b }}"], alias="m"))
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8000
    assert cfg.model.chat_template == "{{ a }}{{ b }}"
    assert cfg.model.served_name() == "m"
    assert cfg.disk_cache is None


def test_sampling_defaults_fill_what_a_request_leaves_out() -> None:
    from api.web.params import Body, sampling
    cfg = parse(model(sampling={"temperature": 0, "top_k": 20, "repeat_penalty": 1.05}))
    got = sampling(Body({"top_p": 0.5}), n_vocab=100, defaults=cfg.model.sampling)
    assert (got.temperature, got.top_k, got.repeat_penalty) == (0.0, 20, 1.05)
    assert got.top_p == 0.5 and got.min_p == 0.05  # the request's own; llama.cpp's default
    assert sampling(Body({"temperature": 1.5}), n_vocab=100,
                    defaults=cfg.model.sampling).temperature == 1.5
    plain = sampling(Body({}), n_vocab=100)  # no model.sampling: llama-server's defaults
    assert (plain.temperature, plain.top_k, plain.top_p) == (0.8, 40, 0.95)


def test_batch_api_is_on_by_default_with_a_store_per_port(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLAMASERVE_CACHE", str(tmp_path))
    on = parse({**model(), "server": {"port": 8123}})
    assert on.server.batch_api and on.server.batch_dir == str(tmp_path / "batches" / "8123")
    named = parse({**model(), "server": {"batch_dir": "~/b"}})
    assert named.server.batch_dir is not None and not named.server.batch_dir.startswith("~")
    off = parse({**model(), "server": {"batch_api": False}})
    assert off.server.batch_dir is None
    with pytest.raises(ConfigError, match="batch_api"):
        parse({**model(), "server": {"batch_api": "yes"}})


def test_served_name_is_never_a_path() -> None:
    assert parse(model()).model.served_name() == "x"


def test_disk_cache_fields_are_accepted() -> None:
    cfg = parse({**model(), "disk_cache": {"path": "~/c", "max_bytes": 10, "min_tokens": 5}})
    assert cfg.disk_cache is not None
    assert cfg.disk_cache.max_bytes == 10 and not cfg.disk_cache.path.startswith("~")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.json")))
def test_shipped_configs_validate(name: str) -> None:
    parse(json.loads((ROOT / "configs" / name).read_text()))


def test_every_shipped_config_passes_check_offline(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`llamaserve check --offline`: the config, its own chat template (a tool conversation
    where the template takes one) and response schema (the markers the parser and grammars
    need: gpt-oss's harmony blocks hold their markers inside the capture group), and every
    model file that is here; Hub files not in the cache are named, not failed."""
    import server
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path in sorted((ROOT / "configs").glob("*.json")):
        code = server.check(["--offline", "-C", str(path)])
        out, err = capsys.readouterr()
        assert code == 0, (path.name, out, err)
        assert "config ok" in out, (path.name, out)
        data = json.loads(path.read_text())["model"]
        if data.get("response_schema", {}).get("properties", {}).get("tool_calls"):
            assert "response schema reads" in out and "..." in out, (path.name, out)


# The largest first prompts of the agent clients docs/COMPATIBILITY.md lists, measured on
# their default requests, and the room an answer needs after one: a shipped chat config must
# hold both in the context one sequence gets.
CLIENT_PROMPTS = {"Codex CLI 0.169": 8_413, "Claude Code 2.1.332": 17_500}
ANSWER_ROOM = 4_096
NOT_FOR_AGENTS = {  # configs no agent client can use, and why
    "all-minilm-l6-v2.json": "an embedding model", "bge-small-en-v1.5.json": "an embedding model",
    "gemma3-270m.json": "a base model without a chat template (completions only)"}


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.json")
                                        if p.name not in NOT_FOR_AGENTS))
def test_shipped_chat_configs_fit_the_agent_clients(name: str) -> None:
    cfg = parse(json.loads((ROOT / "configs" / name).read_text())).model
    per_sequence = cfg.n_ctx if kv_unified(cfg) else cfg.n_ctx // cfg.n_seq_max
    need = max(CLIENT_PROMPTS.values()) + ANSWER_ROOM
    assert per_sequence >= need, (
        f"{name}: a sequence gets {per_sequence} tokens of context; "
        f"{max(CLIENT_PROMPTS, key=CLIENT_PROMPTS.__getitem__)} needs {need}")


def test_mtmd_and_lora_fields(tmp_path: Path) -> None:
    cfg = parse(model(
        mtmd={"mmproj_path": "~/p.gguf", "embedding_cache": {"path": "~/e", "max_bytes": 5},
              "allowed_media_domains": ["Example.COM."], "allowed_local_media_path": str(tmp_path),
              "image_timeout_seconds": 2.5},
        loras=[{"path": "/a/style.gguf"}, {"path": "/b/c.gguf", "name": "code", "scale": 0.5}]))
    mtmd = cfg.model.mtmd
    assert mtmd is not None and mtmd.mmproj_path and not mtmd.mmproj_path.startswith("~")
    assert mtmd.embedding_cache is not None and mtmd.embedding_cache.max_bytes == 5
    assert mtmd.allowed_media_domains == ("example.com",)
    assert mtmd.allowed_local_media_path == str(tmp_path.resolve())
    assert mtmd.image_timeout_seconds == 2.5 and not mtmd.allow_private_media_addresses
    assert [(x.name, x.scale) for x in cfg.model.loras] == [("style", 1.0), ("code", 0.5)]


def test_server_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(model(n_ctxx=1)))
    proc = subprocess.run([sys.executable, str(ROOT / "server.py"), "-C", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "llamaserve: config error: model.n_ctxx: unknown field"]


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{ nope")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        load(broken)


@pytest.mark.parametrize(("n_seq_max", "set_to", "unified"), [
    (1, None, True), (4, None, True), (5, None, True), (16, None, True), (64, None, True),
    (64, True, True), (2, False, False), (64, False, False)])
def test_one_kv_pool_unless_the_config_splits_it(n_seq_max: int, set_to: bool | None,
                                                  unified: bool) -> None:
    """Unset, every sequence may use all of ``n_ctx`` (issue 48: split above four
    sequences by default, an 8k / 16-sequence config refused a 2k prompt)."""
    model: dict[str, object] = {"path": "m.gguf", "n_seq_max": n_seq_max}
    if set_to is not None:
        model["kv_unified"] = set_to
    assert kv_unified(parse({"model": model}).model) is unified


def test_the_scripts_inline_dependencies_are_the_packages() -> None:
    """`uv run --script server.py` installs what server.py's PEP 723 block lists and
    `pip install -e .` what pyproject.toml does: the two lists must name the same
    packages with the same bounds (python-multipart was once missing from the first: the
    Files API failed under `uv run`)."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    block = re.search(r"^# /// script\n(.*?)^# ///$", (root / "server.py").read_text(),
                      re.S | re.M)
    assert block is not None
    script = tomllib.loads("\n".join(line[2:] for line in block.group(1).splitlines()))
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert sorted(script["dependencies"]) == sorted(project["dependencies"])

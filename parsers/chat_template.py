"""Render Hugging Face chat templates in a sandboxed Jinja environment.

Semantics follow ``transformers``' ``apply_chat_template``: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, the ``{% generation %}`` tag,
``raise_exception``,
``strftime_now`` and a ``tojson`` that keeps non-ASCII text and key order.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from parsers.template_adapt import PROBE_TOOLS, Adaptations, adapt, probe, with_descriptions


class TemplateError(ValueError):
    """The template could not be compiled or raised while rendering (a client error)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    if isinstance(value, Iterator):  # a filter's generator (``tools | map(...)``): its items
        value = list(value)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_READS_FUNCTIONS = re.compile(r"[{(+~,]\s*functions\s*[-}+~)|]")  # the variable, not the word


class _Generation(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}``: marks the assistant's own
    text (for training masks) and renders its body as it is."""

    tags = {"generation"}  # noqa: RUF012  (jinja2.ext.Extension declares it so)

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


LIST_CHANGES = ("append", "extend", "pop", "insert")


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, but lists may change (Kimi K2's templates ``append`` to and
    ``pop`` from theirs; llama.cpp's engine allows it, transformers' refuses): a template
    that does gets its own copy of the conversation (``ChatTemplate._render``)."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in LIST_CHANGES:
            return True
        return bool(super().is_safe_attribute(obj, attr, value))


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _Generation])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template syntax error at line {exc.lineno}: {exc}") from exc


LATE_SYSTEM_PROBE = "late-system-probe-8f2c"


def fold_late_system(messages: Sequence[Mapping[str, Any]], leading: bool = False
                     ) -> list[Mapping[str, Any]]:
    """Messages with every system message after the first non-system one folded into a
    user turn: the next user message (before its text), else the last earlier one (after
    its text), else a user message of its own. Leading system messages stay (``leading``:
    they are folded too, for a template with no system role)."""
    out: list[Mapping[str, Any]] = []
    pending: list[str] = []  # late system texts waiting for the next user message
    started = leading
    for m in messages:
        role = m.get("role")
        if role == "system" and started and isinstance(m.get("content"), str):
            pending.append(str(m["content"]))
            continue
        started = started or role != "system"
        if role == "user" and pending and isinstance(m.get("content"), str):
            m = {**m, "content": "\n\n".join([*pending, str(m["content"])])}
            pending = []
        out.append(m)
    if pending:
        for i in range(len(out) - 1, -1, -1):
            if out[i].get("role") == "user" and isinstance(out[i].get("content"), str):
                out[i] = {**out[i], "content": "\n\n".join([str(out[i]["content"]),
                                                            *pending])}
                break
        else:
            out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(source)
        # OpenAI's "developer" role is the system role for templates that predate it
        self.knows_developer = "developer" in source
        self._takes_late_system: bool | None = None
        self._takes_system: bool | None = None
        self._adaptations: Adaptations | None = None
        self._changes_lists = any(f".{name}(" in source for name in LIST_CHANGES)

    @property
    def takes_late_system(self) -> bool:
        """Whether the template renders a system message after the conversation has begun
        (ChatML does; Gemma's and Qwen3's templates refuse or drop it). Probed once."""
        if self._takes_late_system is None:
            probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"},
                     {"role": "system", "content": LATE_SYSTEM_PROBE},
                     {"role": "user", "content": "bye"}]
            try:
                text = self._render(probe, self._no_tools, True, {})
            except TemplateError:
                text = ""
            self._takes_late_system = LATE_SYSTEM_PROBE in text
        return self._takes_late_system

    @property
    def takes_system(self) -> bool:
        """Whether the template renders a system message at all (Gemma 2's raises): when
        it does not, system text goes into the first user turn, as llama.cpp does."""
        if self._takes_system is None:
            try:
                self._render([{"role": "system", "content": "s"},
                              {"role": "user", "content": "u"}], self._no_tools, True, {})
                self._takes_system = True
            except TemplateError:
                self._takes_system = False
        return self._takes_system

    @property
    def adaptations(self) -> Adaptations:
        """What a tool conversation as the OpenAI SDK sends it needs before this template
        takes it (``parsers/template_adapt.py``; nothing when it takes it as sent, or when
        nothing helps: its error is then the client's 400). Probed once."""
        if self._adaptations is None:
            found = probe(lambda m, tools: self._render(m, tools, True, {}), TemplateError)
            self._adaptations = found or Adaptations()
        return self._adaptations

    @cached_property
    def needs_tool_list(self) -> bool:
        """Whether the template iterates ``tools`` without checking it is given (Hermes 2
        Pro / 3): it then gets an empty list, not None. Probed once."""
        return self._needs(None, [])

    @cached_property
    def needs_descriptions(self) -> bool:
        """Whether the template writes every tool's and parameter's ``description``
        unchecked (Command R+): tools then get ``""`` where the client gave none."""
        return self._needs(PROBE_TOOLS, with_descriptions(PROBE_TOOLS))

    def _needs(self, tools: list[Any] | None, instead: list[Any]) -> bool:
        """Whether a one-message conversation fails with ``tools`` but renders with
        ``instead``."""
        plain = [{"role": "user", "content": "u"}]
        for given, renders in ((tools, False), (instead, True)):
            try:
                self._render(plain, given, True, {})
                return renders
            except TemplateError:
                continue
        return False

    @property
    def _no_tools(self) -> list[Any] | None:
        """What the template is given when no tools are offered."""
        return [] if self.needs_tool_list else None

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, **extra: Any) -> str:
        if not self.knows_developer:
            messages = [{**m, "role": "system"} if m.get("role") == "developer" else m
                        for m in messages]
        if tools is None and self.needs_tool_list:
            tools = []
        elif tools and self.needs_descriptions:
            tools = with_descriptions(tools)
        if self.adaptations:
            messages = adapt(messages, self.adaptations)
        if not self.takes_system:
            messages = fold_late_system(messages, leading=True)
        elif not self.takes_late_system:
            messages = fold_late_system(messages)
        return self._render(messages, tools, add_generation_prompt, extra)

    def _adapted(self, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        """Variables some templates read that transformers does not pass (they fail there):
        FireFunction's ``functions`` (the tools' JSON) and ``datetime``, as llama.cpp's
        chat layer gives them."""
        if not _READS_FUNCTIONS.search(self.source):
            return {}
        return {"functions": json.dumps([t.get("function", t) for t in tools or []],
                                        indent=2, ensure_ascii=False) if tools else "",
                "datetime": datetime.now().strftime("%b %d %Y %H:%M:%S GMT")}

    def _render(self, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None, add_generation_prompt: bool,
                extra: dict[str, Any]) -> str:
        context = {
            **self._adapted(tools),
            **extra,
            "messages": copy.deepcopy(list(messages)) if self._changes_lists else messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template error: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateError(f"chat template error: {type(exc).__name__}: {exc}") from exc

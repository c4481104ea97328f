"""The chat path that chat completions, the Responses API and Anthropic's messages share:
render the conversation with the model's template, tokenize it (with its media), build
and check the grammar its tools or response format ask for."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from api.chat.messages import render
from api.chat.tools import OutputRules, build_grammar
from api.media.parts import MediaRefs
from api.media.parts import load as load_media
from api.media.parts import tokenize as tokenize_media
from api.web.errors import APIError, invalid
from api.web.state import ModelState
from engine.constraints.grammar import Grammar, GrammarError
from engine.handle import MediaInput, ModelHandle
from engine.media.spans import MediaSpan
from engine.request import SamplingParams
from engine.sampling.reasoning import ReasoningBudget
from parsers.call_items import MarkupValues, markup_values
from parsers.chat_template import ChatTemplate, TemplateError
from parsers.response_schema import StreamLayout

_Media = tuple[MediaRefs, list[MediaInput]]
log = logging.getLogger("llamaserve.chat")
# a call or JSON answer that must follow the thinking, with no budget set anywhere: the
# thinking may take half of max_tokens (this many tokens without max_tokens), so the
# answer has room and comes back valid
CONSTRAINED_BUDGET = 4096


@dataclass(frozen=True)
class Prepared:
    prompt: list[int]
    params: SamplingParams
    in_reasoning: bool  # the prompt opened a reasoning block (the template, or the server)
    media: tuple[MediaSpan, ...] = ()
    message_ends: tuple[int, ...] = ()  # engine.request.Request.message_ends
    # how call markup's grammar wrote each declared parameter, by tool (parsers.call_items)
    markup_values: MarkupValues = dataclasses.field(default_factory=dict)


def thinking_budget(rules: OutputRules, extra: dict[str, Any], params: SamplingParams,
                    configured: dict[str, int]) -> int | None:
    """Tokens the reasoning may take before the server closes it (None: no limit): the
    request's own budget, else the config's for its ``reasoning_effort``, else the
    config's default, else, when a call or a JSON value must follow, half of
    ``max_tokens``."""
    if rules.reasoning_budget is not None:
        return rules.reasoning_budget
    effort = extra.get("reasoning_effort")
    if isinstance(effort, str) and effort in configured:
        return configured[effort]
    if "default" in configured:
        return configured["default"]
    if rules.constrained:
        return params.max_tokens // 2 if params.max_tokens else CONSTRAINED_BUDGET
    return None


# where a family's generation prompt leaves opening the reasoning to the model; the server
# writes the opener there (the plan needs the block open: the budget counts in it and a
# constraint waits for its end). gpt-oss always reasons (thinking off: an empty analysis
# channel); Gemma 4's template closes an empty thought itself unless thinking is on.
OPEN_AFTER = {"harmony": "<|start|>assistant", "gemma4": "<|turn>model\n"}


def reasoning_opener(layout: StreamLayout, text: str) -> str:
    """What the server appends to the prompt to open the reasoning block ("" if nothing)."""
    after = OPEN_AFTER.get(layout.family or "")
    if after and layout.reasoning_start and text.endswith(after):
        return layout.reasoning_start + ("\n" if layout.family == "gemma4" else "")
    return ""


def thinking_off(extra: dict[str, Any]) -> bool:
    """The request turned thinking off (the template argument, or reasoning_effort none)."""
    return extra.get("enable_thinking") is False or extra.get("reasoning_effort") == "none"


def closing(layout: StreamLayout, constrained: bool) -> str:
    """What the server writes when the budget is spent: the family's end of reasoning (in
    harmony, with the final channel's header when no grammar writes the next header)."""
    end = layout.reasoning_end or ""
    if layout.family == "harmony":
        return end if constrained else end + "<|start|>assistant<|channel|>final<|message|>"
    if layout.family == "gemma4":
        return f"\n{end}"
    return f"\n{end}\n\n"


# a system prompt shorter than this is cheap to evaluate again: no snapshot point for it
SYSTEM_END_MIN_CHARS = 256


def render_turn(model: ModelHandle, template: ChatTemplate, layout: StreamLayout,
                messages: list[dict[str, Any]], rules: OutputRules, extra: dict[str, Any]
                ) -> tuple[str, list[int], bool]:
    """The prompt the model continues (text and tokens), with the reasoning opener the
    server writes for families that leave it to the model (True when it did)."""
    if layout.family == "gemma4" and extra.get("reasoning_effort") not in (None, "none"):
        extra = {"enable_thinking": True, **extra}  # its template reads only this switch
    text, tokens = render(model, template, messages, rules.tools or None, extra)
    opened = reasoning_opener(layout, text)
    if opened:  # the family leaves the block to the model: the server opens it
        text += opened
        tokens = tokens + model.tokenize(opened, add_special=False, parse_special=True)
    return text, tokens, bool(opened)


def _prepare(model: ModelHandle, template: ChatTemplate, layout: StreamLayout,
             messages: list[dict[str, Any]], rules: OutputRules, extra: dict[str, Any],
             params: SamplingParams, media: _Media | None = None,
             budget: int | None = None) -> Prepared:
    """Render, tokenize and build the grammar: the blocking part, on the prepare pool."""
    text, tokens, opened = render_turn(model, template, layout, messages, rules, extra)
    if opened and layout.family == "harmony" and thinking_off(extra):
        budget = 0  # harmony always has an analysis channel: an empty one
    spans: tuple[MediaSpan, ...] = ()
    if media is not None:
        refs, inputs = media
        bos = model.special_token_text("bos")
        add_bos = model.adds_bos and bool(bos) and not text.startswith(bos)
        mp = tokenize_media(model, refs, inputs, text, add_bos)
        tokens, spans = mp.tokens, mp.media
    opener = layout.reasoning_start
    in_reasoning = bool(opener and layout.reasoning_end and text.rstrip().endswith(opener))
    params, grammar = grammar_and_params(model, rules, layout, in_reasoning, params)
    if budget is not None and layout.reasoning_end and (
            in_reasoning or (opener and not thinking_off(extra))):
        # a prompt that did not open the block: the budget counts once the model opens it
        end = model.tokenize(closing(layout, params.grammar is not None), add_special=False,
                             parse_special=True)
        params = dataclasses.replace(params, reasoning=ReasoningBudget(
            budget, layout.reasoning_end, tuple(end),
            start_text="" if in_reasoning else opener or ""))
    ends = system_end(model, text, tokens, messages) if model.state_snapshots and not spans \
        else ()
    return Prepared(tokens, params, in_reasoning, spans, ends,
                    markup_values(grammar.markup_values) if grammar is not None else {})


def system_end(model: ModelHandle, text: str, tokens: list[int],
               messages: list[dict[str, Any]]) -> tuple[int, ...]:
    """Where the system prompt's own text ends in the prompt's tokens (a position no
    end-of-generation token marks when the template folds the system prompt into the
    first user turn, as Gemma's does): the prefix cache snapshots the state there, so a
    new conversation with the same system prompt resumes from it. () when the text is
    not found or its tokens do not start the prompt's."""
    first = messages[0] if messages else {}
    content = first.get("content")
    if first.get("role") not in ("system", "developer") or not isinstance(content, str) \
            or len(content) < SYSTEM_END_MIN_CHARS:
        return ()
    at = text.find(content)
    if at < 0:
        return ()
    ids = model.tokenize(text[: at + len(content)], add_special=False, parse_special=True)
    if tokens and tokens[0] == model.bos_token and (not ids or ids[0] != model.bos_token):
        ids = [model.bos_token, *ids]
    n = len(ids) - 1  # the last token may merge with the text after it
    return (n,) if n > 0 and tokens[:n] == ids[:n] else ()


def with_grammar(model: ModelHandle, rules: OutputRules, layout: StreamLayout,
                 in_reasoning: bool, params: SamplingParams) -> SamplingParams:
    """``params`` with the grammar the rules ask for, checked by llama.cpp (blocking: on
    the prepare pool)."""
    return grammar_and_params(model, rules, layout, in_reasoning, params)[0]


def grammar_and_params(model: ModelHandle, rules: OutputRules, layout: StreamLayout,
                       in_reasoning: bool, params: SamplingParams
                       ) -> tuple[SamplingParams, Grammar | None]:
    """``with_grammar``, and the grammar itself (None: the rules ask for none)."""
    grammar = build_grammar(rules, layout, in_reasoning)
    if grammar is None:
        return params, None
    if grammar.relaxed:
        log.debug("schema bounds relaxed: %s", "; ".join(grammar.relaxed))
    params = dataclasses.replace(params, grammar=grammar.text,
                                 grammar_triggers=grammar.lazy_patterns)
    model.check_grammar(params)
    return params, grammar


async def prepare(state: ModelState, messages: list[dict[str, Any]], rules: OutputRules,
                  extra: dict[str, Any], params: SamplingParams, *, messages_param: str,
                  format_param: str, media: MediaRefs | None = None) -> Prepared:
    """Load the request's media, then ``_prepare`` on the pool; template and grammar
    problems become 400s naming the request's own fields (chat and Responses name them
    differently)."""
    loaded: _Media | None = None
    if media is not None and media.refs:
        assert state.model.media is not None and state.media_policy is not None
        loaded = (media, await load_media(media, state.media_policy))
    budget = thinking_budget(rules, extra, params, dict(state.model_config.reasoning_budget))
    try:
        return await state.client.run(_prepare, state.model, state.template, state.layout,
                                      messages, rules, extra, params, loaded, budget)
    except TemplateError as exc:
        raise APIError(str(exc), param=messages_param, code="template_error") from None
    except (GrammarError, ValueError) as exc:
        raise _grammar_error(exc, rules, format_param) from None


async def prepare_tokens(state: ModelState, tokens: list[int], rules: OutputRules,
                         params: SamplingParams, *, format_param: str) -> Prepared:
    """A prompt that was tokenized without the chat template (a raw prompt, a FIM prompt):
    only its grammar, built and checked as ``prepare`` does; the output is plain text."""
    return Prepared(tokens, await constrained(state, rules, params, format_param), False)


async def constrained(state: ModelState, rules: OutputRules, params: SamplingParams,
                      format_param: str) -> SamplingParams:
    """``params`` with the grammar of rules that offer no tools (a ``grammar``, a JSON
    schema), built and checked on the prepare pool; problems are 400s."""
    try:
        return await state.client.run(with_grammar, state.model, rules, StreamLayout(),
                                      False, params)
    except (GrammarError, ValueError) as exc:
        raise _grammar_error(exc, rules, format_param) from None


def _grammar_error(exc: Exception, rules: OutputRules, format_param: str) -> APIError:
    if rules.grammar is not None:
        return invalid("grammar", f"llama.cpp cannot use this grammar: {exc}")
    tools = getattr(exc, "tools", False) or not rules.json_mode
    return invalid("tools" if tools else format_param, str(exc))

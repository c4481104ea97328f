"""Chat templates render with Hugging Face semantics in a sandbox."""

from __future__ import annotations

import pytest

from parsers.chat_template import ChatTemplate, TemplateError


def test_trim_and_lstrip_blocks_and_tokens() -> None:
    t = ChatTemplate("{{ bos_token }}\n{% for m in messages %}\n  {% if m %}{{ m.role }}:"
                     "{{ m.content }}{% endif %}\n{% endfor %}"
                     "{% if add_generation_prompt %}A:{% endif %}", "<s>", "</s>")
    out = t.render([{"role": "user", "content": "hi"}])
    assert out == "<s>\nuser:hiA:"


def test_tojson_keeps_unicode_and_order() -> None:
    t = ChatTemplate("{{ tools | tojson }}|{{ tools | tojson(indent=2) | length > 0 }}")
    out = t.render([], tools=[{"b": "é", "a": 1}])
    assert out.startswith('[{"b": "é", "a": 1}]|True')


def test_raise_exception_is_a_template_error() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.render([])


def test_syntax_error_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="syntax error"):
        ChatTemplate("{% for %}")


def test_sandbox_blocks_attribute_escape() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError):
        t.render([])


def test_extras_and_strftime_and_loop_controls() -> None:
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                     "{{ m.content }}{% endfor %}{{ enable_thinking }}"
                     "{{ strftime_now('%Y') | length }}")
    out = t.render([{"content": "a"}, {"content": "b"}], enable_thinking=False)
    assert out == "aFalse4"


def test_developer_role_is_system_for_templates_that_do_not_know_it() -> None:
    from parsers.chat_template import ChatTemplate

    old = ChatTemplate("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    assert old.render([{"role": "developer", "content": "be brief"}]) == "[system]be brief"
    new = ChatTemplate("{% for m in messages %}{{ m.role }}{% endfor %}{# developer #}")
    assert new.render([{"role": "developer", "content": "x"}]) == "developer"


# A system message after the conversation has begun (Claude Code's mid-conversation system
# turns, OpenAI's system or developer messages anywhere): kept where the template renders it,
# folded into a user turn where the template refuses or drops it.
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen3's rule: a system message anywhere but first is an error
QWEN3_LIKE = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
              "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
              "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
# Gemma's shape: only a first system message is read (into the first user turn); later ones
# vanish without an error
GEMMA_LIKE = ("{% if messages[0].role == 'system' %}{% set first = messages[0].content + '\n\n'"
              " %}{% set rest = messages[1:] %}{% else %}{% set first = '' %}"
              "{% set rest = messages %}{% endif %}{% for m in rest %}"
              "{% if m.role in ('user', 'assistant') %}<start_of_turn>{{ m.role }}\n"
              "{% if loop.first %}{{ first }}{% endif %}{{ m.content }}<end_of_turn>\n"
              "{% endif %}{% endfor %}")
CONVERSATION = [{"role": "system", "content": "S0"}, {"role": "user", "content": "U1"},
                {"role": "assistant", "content": "A1"}, {"role": "system", "content": "S1"},
                {"role": "user", "content": "U2"}, {"role": "system", "content": "S2"}]


def test_a_template_that_takes_a_late_system_message_gets_it_in_place() -> None:
    t = ChatTemplate(CHATML)
    assert t.takes_late_system
    out = t.render(CONVERSATION)
    # in place, even last (Claude Code's environment block): moving it before the last user
    # message would change the prompt's order once the next turn follows, and the next
    # turn's prompt would miss the prefix cache from there on
    assert out.index("system\nS1") < out.index("user\nU2") < out.index("system\nS2")


@pytest.mark.parametrize("source", [QWEN3_LIKE, GEMMA_LIKE], ids=["refuses", "drops"])
def test_a_late_system_message_is_folded_where_the_template_cannot_take_it(source: str) -> None:
    t = ChatTemplate(source)
    assert not t.takes_late_system
    out = t.render(CONVERSATION)
    # the first system message stays the template's own; S1 opens the next user turn, and
    # S2 (no user turn after it) closes the last one: nothing is lost, nothing raises
    assert "S0" in out and "S1\n\nU2\n\nS2" in out
    assert out.count("S1") == out.count("S2") == 1


def test_folding_keeps_leading_system_messages_and_odd_content() -> None:
    from parsers.chat_template import fold_late_system
    only_system = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}]
    assert fold_late_system(only_system) == only_system
    no_user_after = [{"role": "user", "content": [{"type": "text"}]},
                     {"role": "assistant", "content": "x"}, {"role": "system", "content": "s"}]
    # no string user turn to join: the system text becomes a user turn of its own
    assert fold_late_system(no_user_after)[-1] == {"role": "user", "content": "s"}

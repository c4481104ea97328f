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

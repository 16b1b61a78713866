"""Chat templates: which one is found, that rendering matches transformers', and that the sandbox holds."""

from __future__ import annotations

import copy
import json

import pytest

from folio.demo.tokenizer import CHATML_TEMPLATE
from folio.transformers_utils.chat_template import ChatTemplateError, render_chat, resolve_chat_template
from tests.helpers.tokenizers import test_tokenizer

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello, café 🙂"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Capital of France?"},
]

# A richer template in the style of current chat models: a system block with tools as JSON,
# tool calls and tool results, namespace state, loop controls, bos_token, raise_exception.
RICH_TEMPLATE = """{{- bos_token }}
{%- set ns = namespace(seen_user=false) %}
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}Tools:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
  {%- if message.role == 'system' %}{% continue %}{% endif %}
  {%- if message.role == 'user' %}{% set ns.seen_user = true %}{% endif %}
  {%- if message.role not in ['user', 'assistant', 'tool'] %}{{ raise_exception('unknown role ' + message.role) }}{% endif %}
<|im_start|>{{ message.role }}
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}
{%- if not ns.seen_user %}{{ raise_exception('no user message') }}{% endif %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Météo", "parameters": {"type": "object"}}}]


def test_chatml_rendering_matches_the_hand_written_prompt():
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHello, café 🙂<|im_end|>\n"
        "<|im_start|>assistant\nHi.<|im_end|>\n"
        "<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat(CHATML_TEMPLATE, CONVERSATION) == expected
    assert render_chat(CHATML_TEMPLATE, CONVERSATION, add_generation_prompt=False) == expected.removesuffix(
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, RICH_TEMPLATE], ids=["chatml", "rich"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_rendering_equals_transformers(template, add_generation_prompt, tools):
    tok = copy.copy(test_tokenizer())
    tok.chat_template = template
    messages = CONVERSATION + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]
    if template is CHATML_TEMPLATE:
        messages = CONVERSATION
    ours = render_chat(template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                       bos_token=tok.bos_token, eos_token=tok.eos_token)
    theirs = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs


def test_continue_final_message_equals_transformers():
    tok = copy.copy(test_tokenizer())
    messages = CONVERSATION + [{"role": "assistant", "content": "The capital is"}]
    ours = render_chat(CHATML_TEMPLATE, messages, add_generation_prompt=False, continue_final_message=True)
    theirs = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert ours == theirs and ours.endswith("<|im_start|>assistant\nThe capital is")


def test_tool_call_arguments_sent_as_json_text_reach_the_template_as_objects():
    call = {"type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": "Zürich"})}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = render_chat(RICH_TEMPLATE, messages, bos_token="")
    assert '"arguments": {"city": "Zürich"}' in text
    assert isinstance(call["function"]["arguments"], str)  # the caller's message is untouched


@pytest.mark.parametrize("calls", [60, "weather()", {"function": {"name": "weather"}}])
def test_tool_calls_that_are_not_a_list_are_refused_by_name(calls):
    """The server's fuzz test found `"tool_calls": 60` raising a TypeError (a 500)."""
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    with pytest.raises(ChatTemplateError, match="'tool_calls' must be a list"):
        render_chat(RICH_TEMPLATE, messages, bos_token="")


def test_text_parts_are_flattened_and_other_parts_refused():
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    assert "user\nHello\nthere<|im_end|>" in render_chat(CHATML_TEMPLATE, [{"role": "user", "content": parts}])
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    with pytest.raises(ChatTemplateError, match="image_url"):
        render_chat(CHATML_TEMPLATE, [{"role": "user", "content": image}])
    with pytest.raises(ChatTemplateError, match="role"):
        render_chat(CHATML_TEMPLATE, [{"content": "no role"}])


@pytest.mark.parametrize(
    "escape",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ messages.__class__.__name__ }}",
        "{{ messages.append({'role': 'x'}) }}",
        "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
        "{{ messages[0].update({'role': 'x'}) }}",
    ],
)
def test_sandbox_blocks_python_internals_and_mutation(escape):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError):
        render_chat(escape, messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_a_lone_unsafe_attribute_renders_as_undefined():
    # As in transformers (default Undefined): nothing leaks, and using it any further raises.
    assert render_chat("[{{ messages.__class__ }}]", []) == "[]"


def test_template_errors_are_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="no user message"):
        render_chat(RICH_TEMPLATE, [{"role": "system", "content": "s"}], bos_token="")
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        render_chat("{% for m in messages %}", [])
    with pytest.raises(ChatTemplateError, match="no chat template") as info:
        render_chat(None, CONVERSATION)
    assert isinstance(info.value, ValueError)  # the server maps ValueError to a 400


# ---- resolution order -------------------------------------------------------------------------


class _Tok:
    def __init__(self, chat_template=None):
        self.chat_template = chat_template


def _write(path, name, text):
    (path / name).write_text(text, encoding="utf-8")


def test_override_wins_as_text_or_as_file(tmp_path):
    _write(tmp_path, "chat_template.jinja", "{{ 'folder' }}")
    assert resolve_chat_template(str(tmp_path), _Tok("tok"), "{{ 'inline' }}") == "{{ 'inline' }}"
    _write(tmp_path, "mine.jinja", "{{ 'file' }}")
    assert resolve_chat_template(str(tmp_path), _Tok("tok"), str(tmp_path / "mine.jinja")) == "{{ 'file' }}"
    with pytest.raises(ChatTemplateError, match="neither"):
        resolve_chat_template(str(tmp_path), _Tok(), str(tmp_path / "missing.jinja"))


def test_folder_jinja_then_tokenizer_config_then_tokenizer(tmp_path):
    assert resolve_chat_template(str(tmp_path), _Tok("from-tokenizer"), None) == "from-tokenizer"
    assert resolve_chat_template(str(tmp_path), _Tok(), None) is None
    _write(tmp_path, "tokenizer_config.json", json.dumps({"chat_template": "from-config"}))
    assert resolve_chat_template(str(tmp_path), _Tok("from-tokenizer"), None) == "from-config"
    _write(tmp_path, "chat_template.jinja", "from-jinja")
    assert resolve_chat_template(str(tmp_path), _Tok("from-tokenizer"), None) == "from-jinja"


def test_template_list_takes_default(tmp_path):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    _write(tmp_path, "tokenizer_config.json", json.dumps({"chat_template": named}))
    assert resolve_chat_template(str(tmp_path), _Tok(), None) == "plain"
    _write(tmp_path, "tokenizer_config.json", json.dumps({"chat_template": named[:1]}))
    assert resolve_chat_template(str(tmp_path), _Tok(), None) is None


def test_saved_test_tokenizer_folder_resolves_to_chatml(tmp_path):
    from tests.helpers.tokenizers import save_test_tokenizer

    save_test_tokenizer(str(tmp_path))
    assert (tmp_path / "chat_template.jinja").is_file()
    assert resolve_chat_template(str(tmp_path), _Tok(), None) == CHATML_TEMPLATE


def test_tools_a_template_never_reads_are_warned_about_once() -> None:
    """The model cannot call tools its prompt never showed it: say so, once per template."""
    from tests.helpers.logs import log_records

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    plain = CHATML_TEMPLATE + "{# tools unread #}"  # a template of its own: warnings are once each
    with log_records() as records:
        render_chat(plain, CONVERSATION, tools=tools)
        render_chat(plain, CONVERSATION, tools=tools)
        render_chat(plain, CONVERSATION, documents=[{"text": "d"}])
        render_chat(RICH_TEMPLATE, CONVERSATION, tools=tools, bos_token="<s>")  # reads tools: silent
        render_chat(plain + " ", CONVERSATION, tools=[])  # none given: silent
    warned = [r.getMessage() for r in records if r.levelname == "WARNING"]
    assert len(warned) == 2, warned
    assert warned[0].startswith("Tools were passed") and "'tools'" in warned[0]
    assert warned[1].startswith("Documents were passed") and "'documents'" in warned[1]

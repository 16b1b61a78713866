"""Chat templates: finding a checkpoint's template and rendering a conversation with it, sandboxed.

Templates come from checkpoints, that is from strangers, so they run in Jinja's
ImmutableSandboxedEnvironment: no access to Python internals (`__class__`, `__globals__`, ...),
no mutation of the messages. The environment matches transformers' (trim_blocks, lstrip_blocks,
loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text), so a
template renders here exactly as `tokenizer.apply_chat_template(..., tokenize=False)` renders it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from folio.logger import init_logger

logger = init_logger(__name__)

_JINJA_MARKERS = ("{{", "{%", "{#")
# Appended to the final message when it is to be continued; the render is cut where it appears.
_CONTINUE_MARKER = "<<folio-continue-final-message>>"


class ChatTemplateError(ValueError):
    """No usable chat template, a template that fails, or messages it cannot take (a 400)."""


# ---- finding the template ---------------------------------------------------------------------


def resolve_chat_template(model_dir: str | None, tokenizer: Any, override: str | None) -> str | None:
    """The template to use, or None if the model has none.

    Order: `override` (a file path or the template text itself), the folder's
    chat_template.jinja, its chat_template.json, tokenizer_config.json's chat_template (a string,
    or a list of {name, template} of which "default" is taken), the tokenizer's own.
    """
    if override is not None:
        return load_chat_template(override)
    if model_dir and os.path.isdir(model_dir):
        found = _template_in_folder(model_dir)
        if found is not None:
            return found
    return _pick_default(getattr(tokenizer, "chat_template", None), "the tokenizer")


def load_chat_template(source: str | os.PathLike[str]) -> str:
    """A template from a file path, or `source` itself when it is Jinja text."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):  # 5 would fail in posixpath with a TypeError
        raise ChatTemplateError(f"chat_template must be a file path or the template text, got {source!r}.")
    path = os.path.expanduser(source)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    if any(marker in source for marker in _JINJA_MARKERS):
        return source
    raise ChatTemplateError(
        f"Chat template {source!r} is neither an existing file nor Jinja template text."
    )


def _template_in_folder(folder: str) -> str | None:
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    for name in ("chat_template.json", "tokenizer_config.json"):
        config = _read_json(os.path.join(folder, name))
        if config is not None and config.get("chat_template") is not None:
            return _pick_default(config["chat_template"], name)
    return None


def _pick_default(template: Any, source: str) -> str | None:
    """A template string as is; from a list of {name, template} (or a dict by name), "default"."""
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, Sequence):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
    if isinstance(template, Mapping):
        if isinstance(template.get("default"), str):
            return template["default"]
        logger.warning(
            "%s has chat templates %s but none named 'default'; pass one with --chat-template.",
            source,
            sorted(str(k) for k in template),
        )
        return None
    raise ChatTemplateError(
        f"The chat_template in {source} is neither a string nor a list of templates."
    )


def _read_json(path: str) -> dict[str, Any] | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ChatTemplateError(f"Could not read {path}: {e}") from None
    return data if isinstance(data, dict) else None


# ---- rendering --------------------------------------------------------------------------------


# render_chat's own arguments: chat_template_kwargs may not set them.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "template", "messages", "add_generation_prompt", "continue_final_message",
    "tools", "documents", "bos_token", "eos_token",
})


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """chat_template_kwargs as a dict, refusing the names render_chat sets itself."""
    if kwargs is not None and not isinstance(kwargs, Mapping):  # dict([1]) or dict("x") fails unclearly
        raise ChatTemplateError(f"chat_template_kwargs must be a dict of template variables, got {kwargs!r}.")
    kwargs = dict(kwargs or {})
    names = [k for k in kwargs if not isinstance(k, str)]
    if names:
        raise ChatTemplateError(f"chat_template_kwargs keys must be strings, got {names[0]!r}.")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(reserved)}.")
    return kwargs


def render_chat(
    template: str | None,
    messages: Sequence[Any],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **kwargs: Any,
) -> str:
    """Render `messages` (dicts or pydantic models) with `template` into one prompt string.

    Text-part lists ({"type": "text", "text": ...}) are joined into one string per message;
    tool-call arguments given as JSON text become objects, as templates expect. Extra keyword
    arguments reach the template as variables (e.g. enable_thinking).
    """
    if template is None:
        raise ChatTemplateError(
            "This model has no chat template, so chat messages cannot be turned into a prompt. "
            "Pass one with --chat-template (a file or the template text)."
        )
    if add_generation_prompt and continue_final_message:
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true.")
    conversation = [_plain_message(m) for m in messages]
    if continue_final_message:
        _mark_final_message(conversation)
    variables = {"bos_token": bos_token, "eos_token": eos_token, **kwargs}
    variables = {k: _plain(v) for k, v in variables.items() if v is not None}
    compiled = _compile(template)
    _warn_if_unread(template, tools=tools, documents=documents)
    try:
        text = compiled.render(
            messages=conversation,
            tools=_plain(tools),
            documents=_plain(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except _TEMPLATE_FAILURES as e:
        raise ChatTemplateError(f"The chat template failed to render: {e}") from e
    return _cut_at_marker(text) if continue_final_message else text


# What a template (a stranger's code) can raise while rendering: its own errors, bad operations
# ({{ 1/0 }}, {{ x[5] }} on a string), the sandbox's range limit (OverflowError), runaway
# recursion or allocation. All are the template's failure, reported as such (a 400), never a 500.
_TEMPLATE_FAILURES = (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError,
                      RecursionError, MemoryError)


def _plain_message(message: Any) -> dict[str, Any]:
    if callable(getattr(message, "model_dump", None)):
        message = message.model_dump(exclude_none=True)
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ChatTemplateError(f"Each message must be an object with a string 'role', got {message!r}.")
    plain = {str(k): _plain(v) for k, v in message.items()}
    if "content" in plain:
        plain["content"] = _flatten_content(plain["content"])
    calls = plain.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ChatTemplateError(f"A message's 'tool_calls' must be a list of tool calls, got {calls!r}.")
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass  # not JSON: the template gets the text as it was sent
    return plain


def _flatten_content(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(f"Message content must be a string or a list of parts, got {content!r}.")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ChatTemplateError(
                f"Message content part of type {kind!r} is not supported; only 'text' parts are."
            )
        if not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"A 'text' content part needs a string 'text', got {part.get('text')!r}.")
        texts.append(part["text"])
    return "\n".join(texts)


def _plain(value: Any) -> Any:
    """Rebuild from JSON types only, so the template never reaches the caller's objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump(exclude_none=True))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    # Subclasses (str enums, IntEnum, ...) become their base value: no extra methods to call.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise ChatTemplateError(f"Chat template input of type {type(value).__name__} is not JSON data.")


def _mark_final_message(conversation: list[dict[str, Any]]) -> None:
    if not conversation or not isinstance(conversation[-1].get("content"), str):
        raise ChatTemplateError("continue_final_message needs a final message with text content.")
    conversation[-1]["content"] += _CONTINUE_MARKER


def _cut_at_marker(text: str) -> str:
    index = text.rfind(_CONTINUE_MARKER)
    if index < 0:
        raise ChatTemplateError("continue_final_message: the template dropped the final message's text.")
    return text[:index]


# ---- the sandbox ------------------------------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names, so no attribute can shadow internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"A chat template may not set {name!r} on a namespace.")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _warn_if_unread(template: str, **given: Any) -> None:
    """Warn (once per template and variable) when tools or documents were given but the template
    never reads them: the model then never sees them, which the caller should know."""
    for name, value in given.items():
        if value and name not in _variables_read(template):
            _warn_unread(template, name)


@functools.lru_cache(maxsize=64)  # bounded: a template per request must not grow a set forever
def _warn_unread(template: str, name: str) -> None:
    logger.warning(
        "%s were passed to a chat template that never reads '%s': the model does not see them "
        "in its prompt (pass a template that renders them with --chat-template).",
        name.capitalize(), name,
    )


@functools.lru_cache(maxsize=32)
def _variables_read(template: str) -> frozenset[str]:
    """The names a template reads from its context (called after _compile, so it parses)."""
    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(template)))


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"The chat template is not valid Jinja (line {e.lineno}): {e.message}"
        ) from e

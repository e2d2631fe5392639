"""ChatTemplate: render a checkpoint's own jinja chat template, as transformers does.

The output equals `tokenizer.apply_chat_template(messages, tools=..., tokenize=False, ...)`:
the same sandboxed environment and helpers (raise_exception, tojson, strftime_now), the same
clean-up of the inputs (None-valued message keys dropped, objects turned into plain data,
reasoning copied under `reasoning_content` and `thinking`), and the tokenizer's named special
tokens passed as variables. The prompt format lives in the template only.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.text.tokenizer import read_json

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The template rejected the conversation (its raise_exception) or could not be used."""


class ChatTemplate:
    def __init__(self, templates: str | dict[str, str], special_tokens: dict[str, str] | None = None):
        """`templates`: one template, or several by name ("default", "tool_use", ...).
        `special_tokens`: variables such as bos_token / eos_token, as tokenizer_config.json names them."""
        sources = {"default": templates} if isinstance(templates, str) else dict(templates)
        env = _environment()
        try:
            self._compiled = {name: env.from_string(source) for name, source in sources.items()}
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not parse: {e}") from None
        self.sources = sources
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> ChatTemplate:
        """Template files (chat_template.jinja, additional_chat_templates/*.jinja) win over
        tokenizer_config.json's `chat_template`; chat_template.json (processor) is the fallback."""
        path = Path(path)
        config = read_json(path / "tokenizer_config.json")
        templates = {}
        if (path / "chat_template.jinja").is_file():
            templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
        for file in sorted((path / "additional_chat_templates").glob("*.jinja")):
            templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
        if not templates:
            found = config.get("chat_template") or read_json(path / "chat_template.json").get("chat_template")
            if isinstance(found, list):
                templates = {entry["name"]: entry["template"] for entry in found}
            elif isinstance(found, str):
                templates["default"] = found
        if not templates:
            raise ChatTemplateError(f"{path} has no chat template (chat_template.jinja or tokenizer_config.json)")
        return cls(templates, _named_special_tokens(config))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    def render(
        self,
        messages: list[Mapping[str, Any]],
        tools: list[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        *,
        template_name: str | None = None,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """Render the conversation. `tools` are JSON-schema dicts; `template_kwargs` reach the template
        as variables (enable_thinking, reasoning_effort, preserve_thinking, add_vision_id, ...).
        `continue_final_message`: the last message (an assistant's reply cut short) is left open, so the
        model continues it: the rendering without a generation prompt, cut right after that message's text
        (its content, or its reasoning when it has no content yet), as transformers does."""
        if continue_final_message:
            rendered = self.render(messages, tools, add_generation_prompt=False, template_name=template_name,
                                   **template_kwargs)
            return _cut_after_final(rendered, messages[-1] if messages else {})
        template = self._select(template_name, tools)
        if not messages:
            raise ChatTemplateError("cannot render an empty conversation")
        if tools is not None and not all(isinstance(tool, Mapping) for tool in tools):
            raise ChatTemplateError("tools must be JSON-schema dicts")
        context = {
            "documents": None,
            **self.special_tokens,
            **_plain(template_kwargs),
            "messages": _prepare_messages(messages),
            "tools": _plain(tools),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return template.render(context)
        except ChatTemplateError:
            raise
        except Exception as e:  # the template is untrusted code; any failure is a bad request
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e

    def _select(self, name: str | None, tools) -> jinja2.Template:
        if name is None:
            name = "tool_use" if tools is not None and "tool_use" in self._compiled else "default"
        if name not in self._compiled:
            raise ChatTemplateError(f"no chat template named {name!r}; this checkpoint has {', '.join(self.names)}")
        return self._compiled[name]


def _cut_after_final(rendered: str, final: Mapping[str, Any]) -> str:
    content = final.get("content") or ""
    if not isinstance(content, str):           # list content: its last text part
        content = next((p.get("text") or "" for p in reversed(content) if isinstance(p, Mapping)
                        and p.get("type") == "text"), "")
    text = content if content.strip() else next((final[k] for k in _REASONING_FIELDS if final.get(k)), "")
    for candidate in (text, text.strip()):
        if candidate.strip() and candidate in rendered:
            return rendered[:rendered.rindex(candidate) + len(candidate)]
    raise ChatTemplateError("continue_final_message: the final message's text does not appear in the rendering")


def _prepare_messages(messages) -> list[dict]:
    prepared = []
    for message in _plain(list(messages)):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"a chat message must be a dict, got {message!r}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:  # templates read one of several names for it
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def _plain(value: Any) -> Any:
    """Rebuild inputs out of plain JSON-like types, so the sandbox never sees foreign objects
    (images, arrays, pydantic models); anything else becomes a placeholder like "<ndarray>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # enums and other subclasses carry extra methods
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    numpy = sys.modules.get("numpy")  # a numpy scalar can only exist once numpy is imported
    if numpy is not None and isinstance(value, numpy.generic):
        return _plain(value.item())  # np.bool_(False) must stay falsy
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _named_special_tokens(config: dict) -> dict[str, str]:
    """bos_token, eos_token, image_token, ...: every `*_token` entry whose value is a token."""
    entries = list(config.items())
    for group in ("extra_special_tokens", "model_specific_special_tokens"):
        if isinstance(config.get(group), dict):
            entries += config[group].items()
    named = {}
    for key, value in entries:
        value = value.get("content") if isinstance(value, dict) else value
        if key.endswith("_token") and isinstance(value, str):
            named[key] = value
    return named


# --- the jinja environment (transformers' chat_template_utils, same helpers and safeguards) ---


def _raise_exception(message):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # not jinja's own tojson, which escapes HTML characters
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` for templates, without the type itself (no route to its attributes)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore-prefixed names (a route to Python internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks): render the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(), namespace=_Namespace
    )
    return env

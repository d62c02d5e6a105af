"""What a model's own chat template accepts, read from its directory (offline, before the
vLLM Switchyard launched answers).

A Hugging Face model directory carries its chat template in ``tokenizer_config.json``
(``chat_template``: a string, or a list of named templates of which ``default`` is the one
vLLM uses) or in ``chat_template.jinja``. It is rendered here, in Jinja2's sandbox and with
the names such templates call (``raise_exception``, ``strftime_now``, ``bos_token``,
``eos_token``), on the conversations :mod:`gateway.shaping.probe` asks a deployment's
``/tokenize`` about: a placement is accepted when each renders, its late system message
included. Jinja2 is optional (the ``chat-templates`` extra): without it nothing is read and
the ``/tokenize`` probe decides alone.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from gateway.shaping.policy import Placement

LATE_SYSTEM: dict[str, Any] = {"role": "system", "content": "The current date is 2026-12-07."}
_USER: dict[str, Any] = {"role": "user", "content": "What is the capital of France?"}
_ANSWER: dict[str, Any] = {"role": "assistant", "content": "Paris."}
_NEXT: dict[str, Any] = {"role": "user", "content": "And of Italy?"}
_CALL: dict[str, Any] = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "Italy"}'}}
    ],
}
_RESULT: dict[str, Any] = {"role": "tool", "tool_call_id": "call_1", "content": "Rome"}
_HEAD: dict[str, Any] = {"role": "system", "content": "You are a geography assistant."}

# The conversations that test a placement (asked of vLLM's /tokenize, or rendered here with
# the model's own template). Per placement, latest first, the conversations it produces:
# (without, with) the late message. PLAIN: one any template renders.
PLAIN: list[dict[str, Any]] = [_HEAD, _USER]
_CHAT: list[dict[str, Any]] = [_HEAD, _USER, _ANSWER, _NEXT]
_STEP: list[dict[str, Any]] = [_HEAD, _USER, _CALL, _RESULT]
PROBES: list[tuple[Placement, list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]]] = [
    ("after_last_turn", [(_CHAT, [*_CHAT, LATE_SYSTEM]), (_STEP, [*_STEP, LATE_SYSTEM])]),
    ("after_last_tool", [(_STEP, [*_STEP, LATE_SYSTEM]), (_CHAT, [*_CHAT[:3], LATE_SYSTEM, _NEXT])]),
    ("before_last_user", [(_CHAT, [*_CHAT[:3], LATE_SYSTEM, _NEXT])]),
]


def chat_template(model_dir: Path) -> str | None:
    """The model's chat template (``chat_template.jinja`` first, as recent models ship it),
    None when it has none or its directory cannot be read."""
    try:
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8")
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(found, list):  # named templates: vLLM renders the default one
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) else None


def _token(config: dict[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def render_placement(model_dir: Path) -> Placement | None:
    """The latest placement the model's chat template renders (``end_of_system`` when it
    renders none); None when there is no template or Jinja2 is not installed."""
    source = chat_template(model_dir)
    if source is None:
        return None
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        template = env.from_string(source)
    except TemplateError:
        return None
    names = {"bos_token": _token(config, "bos_token"), "eos_token": _token(config, "eos_token")}

    def renders(messages: list[dict[str, Any]]) -> str | None:
        try:
            return template.render(messages=messages, add_generation_prompt=True, tools=None, **names)
        except Exception:  # a template raises what it likes (TemplateError, TypeError, ...)
            return None

    late = str(LATE_SYSTEM["content"])
    for placement, conversations in PROBES:
        if all(
            (plain := renders(without)) is not None
            and (text := renders(with_late)) is not None
            and text.count(late) > plain.count(late)
            for without, with_late in conversations
        ):
            return placement
    return "end_of_system"

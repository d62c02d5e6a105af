"""What shaping reads of a chat request body: its tools' names, the head message's units as
text, tool-call arguments in canonical form, and the turns that
decide where per-request content may go (the newest user turn, the last tool result, an
answer before them)."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import orjson

from gateway.shaping.policy import Placement

_HEAD_ROLES = ("system", "developer")
_LONG_NUMBER = re.compile(r"\d{16}")


def _tool_name(tool: Any) -> str:
    if isinstance(tool, dict):
        function = tool.get("function")
        if isinstance(function, dict):
            return str(function.get("name", ""))
        return str(tool.get("name", ""))
    return ""


def _canonical_arguments(messages: list[Any]) -> None:
    """Tool-call arguments (JSON inside a string) re-serialized with sorted keys."""
    for message in messages:
        if not isinstance(message, dict) or not message.get("tool_calls"):
            continue
        for call in message["tool_calls"]:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
                continue
            if _LONG_NUMBER.search(function["arguments"]):
                continue  # a double could not hold it exactly: the bytes stay as they are
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(function["arguments"])
                function["arguments"] = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()


def _part_text(part: Any) -> str | None:
    """The text of a text content part; None for any other part (an image never moves)."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    return None


def _texts(content: str | list[Any]) -> list[str | None]:
    """The head's units as text: its lines, or its parts' texts (None for a non-text part)."""
    if isinstance(content, str):
        return list(content.split("\n"))  # list[str] is not a list[str | None]
    return [_part_text(part) for part in content]


def _late_at(messages: list[Any], at: int) -> str:
    """Where the system message inserted at ``at`` went: ``user`` (before the newest user
    turn), ``tool`` (after an agent step's last tool result) or ``turn`` (after the user's
    newest message)."""
    if at < len(messages) - 1:
        return "user"
    before = messages[at - 1]
    return "tool" if isinstance(before, dict) and before.get("role") == "tool" else "turn"


def _has_history(messages: list[Any], at: int) -> bool:
    """Whether an answer (an assistant turn) comes before position ``at``."""
    for i in range(1, min(at, len(messages))):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return True
    return False


def _late_index(messages: list[Any], placement: Placement) -> int:
    """Where a system message of per-request content goes (-1: nowhere; it stays in the system
    message): after the newest turn (``after_last_turn``: the user's message or an agent
    step's last tool result), after the last tool result only (``after_last_tool``), or
    before the newest user turn. The later, the more of the conversation before it (the
    previous turn, the step's calls and results) stays a reusable prefix."""
    if placement == "end_of_system":
        return -1
    last_user = _last_user_index(messages)
    if last_user <= 0:
        return -1
    last = messages[-1]
    role = last.get("role") if isinstance(last, dict) else None
    if role == "tool" and placement in ("after_last_tool", "after_last_turn"):
        return len(messages)
    if role == "user" and placement == "after_last_turn":
        return len(messages)
    return last_user


def _last_user_index(messages: list[Any]) -> int:
    for i in range(len(messages) - 1, 0, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "user":
            return i
    return -1

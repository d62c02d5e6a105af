"""A Chat Completions answer as a Responses API ``response`` object.

The response echoes the request's settings (``instructions``, ``tools``, ``text``,
``metadata`` ...) as OpenAI's does, so the SDKs' typed objects and helpers
(``output_text``, ``responses.parse``) read it unchanged.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.dialects.responses.wire import new_id, responses_usage


def response_shell(
    request: dict[str, Any], response_id: str, model: str, created_at: float
) -> dict[str, Any]:
    """A ``response`` object with no output yet (status ``in_progress``), echoing ``request``."""
    reasoning = request.get("reasoning") or {}
    text = dict(request.get("text") or {})
    text.setdefault("format", {"type": "text"})
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "service_tier": request.get("service_tier", "default"),
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": text,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_logprobs": request.get("top_logprobs", 0),
        "top_p": request.get("top_p", 1.0),
        "truncation": request.get("truncation", "disabled"),
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def finish_status(response: dict[str, Any], finish_reason: str | None) -> None:
    """Set ``status`` (and ``incomplete_details``) from the chat answer's finish reason."""
    if finish_reason == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "content_filter"}
    else:
        response["status"] = "completed"
        response["completed_at"] = int(time.time())


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message`` output item holding ``text``."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` output item holding the upstream's reasoning text."""
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def from_chat(request: dict[str, Any], chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The ``response`` object for a whole chat completion ``chat`` answering ``request``."""
    response = response_shell(
        request, new_id("resp"), model or str(chat.get("model", "")), chat.get("created") or time.time()
    )
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(new_id("rs"), reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(message_item(new_id("msg"), content))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        output.append(
            {
                "id": new_id("msg"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "refusal", "refusal": refusal}],
            }
        )
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(
            function_call_item(
                new_id("fc"),
                str(call.get("id") or new_id("call")),
                str(function.get("name", "")),
                str(function.get("arguments") or ""),
                "completed",
            )
        )
    response["output"] = output
    finish_status(response, choice.get("finish_reason"))
    response["usage"] = responses_usage(chat.get("usage"))
    return response

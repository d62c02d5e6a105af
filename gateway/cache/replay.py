"""A stored answer in the form the request asks for, and a streamed answer as an entry.

Entries hold the non-stream JSON of their endpoint's kind (a chat completion, or a
Responses ``response``). A stream request gets it as the endpoint's events, all at once:
chat chunks (which ``/v1/messages`` turns into Anthropic events with the translator it
uses for every chat stream), or Responses events. A streamed answer is stored as the chat
completion its chunks add up to, or the finished ``response`` its scanner kept.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects.responses.stream import sse_event
from gateway.providers.sse import complete_events, event_data


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_chunks(completion: dict[str, Any], include_usage: bool) -> bytes:
    """A chat completion as the chunks of its stream, ending with ``[DONE]``."""
    base = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    if completion.get("system_fingerprint") is not None:
        base["system_fingerprint"] = completion["system_fingerprint"]
    out: list[bytes] = []
    for choice in completion.get("choices") or ():
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role", "assistant")}
        for name in ("content", "reasoning_content", "refusal"):
            if message.get(name) is not None:
                delta[name] = message[name]
        calls = message.get("tool_calls")
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        first = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        out.append(_data({**base, "choices": [first]}))
        last = {"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.get("finish_reason")}
        out.append(_data({**base, "choices": [last]}))
    if include_usage and completion.get("usage") is not None:
        out.append(_data({**base, "choices": [], "usage": completion["usage"]}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def assemble_chat(stream: bytes, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The chat completion a whole chat stream adds up to (None: not one answer's chunks)."""
    head: dict[str, Any] = {}
    text: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: Any = None
    events, _ = complete_events(b"", stream)
    for raw in events:
        payload = event_data(raw)
        if not payload or payload == b"[DONE]":
            continue
        obj = orjson.loads(payload)
        if not isinstance(obj, dict) or obj.get("error") is not None:
            return None
        if not head:
            head = {k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj}
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                return None
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            if isinstance(delta.get("reasoning_content"), str):
                reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or ():
                _add_call(calls, call)
            finish = choice.get("finish_reason") or finish
    if not head or finish is None:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    choice_out = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    answer = {"id": head.get("id", ""), "object": "chat.completion", **head, "choices": [choice_out]}
    if usage is not None:
        answer["usage"] = usage
    return answer


def _add_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = int(delta.get("index", 0))
    function = delta.get("function") or {}
    call = calls.get(index)
    if call is None:
        call = calls[index] = {
            "id": delta.get("id", ""),
            "type": delta.get("type", "function"),
            "function": {"name": function.get("name", ""), "arguments": ""},
        }
    if isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]


def responses_events(response: dict[str, Any]) -> bytes:
    """A finished ``response`` as the typed events of its stream, ending with its terminal event."""
    seq = 0
    out: list[bytes] = []

    def emit(payload: dict[str, Any]) -> None:
        nonlocal seq
        out.append(sse_event({"type": payload["type"], "sequence_number": seq, **payload}))
        seq += 1

    shell = {**response, "status": "in_progress", "output": [], "usage": None}
    emit({"type": "response.created", "response": shell})
    emit({"type": "response.in_progress", "response": shell})
    for index, item in enumerate(response.get("output") or ()):
        _item_events(emit, index, item)
    status = response.get("status")
    terminal = "response.incomplete" if status == "incomplete" else "response.completed"
    emit({"type": terminal, "response": response})
    return b"".join(out)


def _item_events(emit: Any, index: int, item: dict[str, Any]) -> None:
    kind, item_id = item.get("type"), item.get("id", "")
    partial = {**item, "status": "in_progress"}
    if kind == "message":
        partial["content"] = []
    elif kind == "function_call":
        partial["arguments"] = ""
    emit({"type": "response.output_item.added", "output_index": index, "item": partial})
    if kind == "message":
        for c_index, part in enumerate(item.get("content") or ()):
            where = {"item_id": item_id, "output_index": index, "content_index": c_index}
            empty = {**part, "text": ""} if "text" in part else part
            emit({"type": "response.content_part.added", **where, "part": empty})
            if part.get("type") == "output_text":
                piece = part.get("text", "")
                emit({"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []})
                emit({"type": "response.output_text.done", **where, "text": piece, "logprobs": []})
            emit({"type": "response.content_part.done", **where, "part": part})
    elif kind == "function_call":
        args = item.get("arguments", "")
        where = {"item_id": item_id, "output_index": index}
        emit({"type": "response.function_call_arguments.delta", **where, "delta": args})
        emit(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": item.get("name"),
                "arguments": args,
            }
        )
    emit({"type": "response.output_item.done", "output_index": index, "item": item})

"""Gemini ``GenerateContentResponse`` -> OpenAI chat completions: the answer, its stream, its
usage, its errors.

- **Finish reasons**: ``STOP`` -> ``stop`` (``tool_calls`` when the turn calls functions),
  ``MAX_TOKENS`` -> ``length``, the safety family (``SAFETY``, ``RECITATION``, ``BLOCKLIST``,
  ``PROHIBITED_CONTENT``, ``SPII``, ``IMAGE_SAFETY`` ...) -> ``content_filter``, anything else
  -> ``stop``. A prompt Gemini refused to answer (``promptFeedback.blockReason``, no
  candidates) is a ``content_filter`` finish whose ``refusal`` says why, never an empty
  success.
- **Usage**: ``promptTokenCount`` already counts the cached part, as OpenAI's
  ``prompt_tokens`` does; ``cachedContentTokenCount`` -> ``prompt_tokens_details.cached_tokens``;
  thinking is billed as output, so ``completion_tokens = candidatesTokenCount +
  thoughtsTokenCount`` with the thoughts also in ``completion_tokens_details.reasoning_tokens``.
- **Errors**: Google's ``{"error": {"code", "message", "status", "details"}}`` becomes OpenAI's
  error object (code: the ``status`` name), a ``RetryInfo.retryDelay`` a ``Retry-After``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from gateway.dialects.gemini.request import make_call_id
from gateway.providers.sse import closing_events, complete_events, event_data

FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "LANGUAGE": "content_filter",
}
"""Gemini ``finishReason`` -> OpenAI ``finish_reason`` (any other: ``stop``)."""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _index(candidate: dict[str, Any], position: int) -> int:
    index = candidate.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else position


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def openai_usage(meta: Any) -> dict[str, Any] | None:
    """A ``usageMetadata`` object in OpenAI's shape (see the module docstring)."""
    if not isinstance(meta, dict):
        return None
    prompt = _int(meta.get("promptTokenCount")) + _int(meta.get("toolUsePromptTokenCount"))
    thoughts = _int(meta.get("thoughtsTokenCount"))
    completion = _int(meta.get("candidatesTokenCount")) + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": _int(meta.get("cachedContentTokenCount"))},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


def blocked_refusal(response: dict[str, Any]) -> str | None:
    """Why Gemini refused the prompt itself (``promptFeedback.blockReason``), if it did."""
    feedback = response.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if not reason:
        return None
    message = feedback.get("blockReasonMessage") if isinstance(feedback, dict) else None
    return f"Gemini blocked the prompt ({reason})" + (f": {message}" if message else "")


def _tool_call(call: dict[str, Any], signature: Any) -> dict[str, Any]:
    return {
        "id": make_call_id(signature),
        "type": "function",
        "function": {
            "name": str(call.get("name", "")),
            "arguments": orjson.dumps(call.get("args") or {}).decode(),
        },
    }


def candidate_parts(candidate: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """``(text, tool calls)`` of one candidate's parts; thought summaries are left out."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    content = candidate.get("content")
    for part in _list(content.get("parts") if isinstance(content, dict) else None):
        if not isinstance(part, dict) or part.get("thought") is True:
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part.get("functionCall"), dict):
            calls.append(_tool_call(part["functionCall"], part.get("thoughtSignature")))
    return "".join(texts), calls


def finish_reason(reason: Any, has_calls: bool) -> str:
    """The OpenAI ``finish_reason`` of a Gemini ``finishReason``."""
    mapped = FINISH_REASONS.get(str(reason), "stop")
    return "tool_calls" if mapped == "stop" and has_calls else mapped


def completion_id(response: dict[str, Any]) -> str:
    """The answer's id: Gemini's ``responseId`` when it sent one."""
    rid = response.get("responseId")
    return f"chatcmpl-{rid}" if isinstance(rid, str) and rid else "chatcmpl-" + secrets.token_hex(12)


def to_chat_completion(response: dict[str, Any], model: str | None) -> dict[str, Any]:
    """A ``generateContent`` answer as a ``chat.completion`` object."""
    choices = []
    refusal = blocked_refusal(response)
    if refusal is not None:
        message = {"role": "assistant", "content": None, "refusal": refusal}
        choices.append({"index": 0, "message": message, "logprobs": None, "finish_reason": "content_filter"})
    for position, candidate in enumerate(_list(response.get("candidates"))):
        if not isinstance(candidate, dict):
            continue
        text, calls = candidate_parts(candidate)
        reply: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            reply["tool_calls"] = calls
        choices.append(
            {
                "index": _index(candidate, position),
                "message": reply,
                "logprobs": None,
                "finish_reason": finish_reason(candidate.get("finishReason"), bool(calls)),
            }
        )
    return {
        "id": completion_id(response),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or response.get("modelVersion") or "",
        "choices": choices,
        "usage": openai_usage(response.get("usageMetadata")),
    }


def openai_error(obj: Any, status: int) -> dict[str, Any]:
    """Google's error object (``{"error": {"code", "message", "status"}}``) in OpenAI's shape."""
    inner = obj.get("error") if isinstance(obj, dict) else None
    err: dict[str, Any] = inner if isinstance(inner, dict) else {}
    code = str(err.get("status") or f"http_{status}")
    kind = "invalid_request_error" if 400 <= status < 500 and status != 429 else "api_error"
    message = str(err.get("message") or f"Gemini answered HTTP {status}")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_details(obj: Any) -> tuple[str | None, str | None]:
    """``(RetryInfo.retryDelay, ErrorInfo.reason)`` from a Google error's ``details``."""
    inner = obj.get("error") if isinstance(obj, dict) else None
    details = inner.get("details") if isinstance(inner, dict) else None
    delay = reason = None
    for detail in details if isinstance(details, list) else ():
        if not isinstance(detail, dict):
            continue
        kind = str(detail.get("@type", ""))
        if kind.endswith("google.rpc.RetryInfo") and isinstance(detail.get("retryDelay"), str):
            delay = detail["retryDelay"]
        elif kind.endswith("google.rpc.ErrorInfo") and isinstance(detail.get("reason"), str):
            reason = detail["reason"]
    return delay, reason


def seconds(duration: str) -> str | None:
    """A protobuf ``Duration`` in JSON (``"27s"``, ``"1.5s"``) as decimal seconds, or ``None``."""
    if not duration.endswith("s"):
        return None
    try:
        value = float(duration[:-1])
    except ValueError:
        return None
    return f"{max(0.0, value):g}"


class GeminiStreamScanner:
    """The :class:`~gateway.providers.base.Scanner` of a ``streamGenerateContent?alt=sse``
    stream: each event (a whole ``GenerateContentResponse``) translated to OpenAI chunks.

    Gemini ends a stream by closing it after the event that carries the candidate's
    ``finishReason`` (or a ``promptFeedback.blockReason``); that event is the end here, and
    the scanner then adds the usage chunk and ``data: [DONE]``. A stream that closes before
    it is incomplete, never a success."""

    __slots__ = (
        "_created",
        "_finished",
        "_id",
        "_model",
        "_started",
        "_strip_usage",
        "_tail",
        "_tools",
        "_usage_meta",
        "chunks",
        "done",
        "error",
        "malformed",
        "usage",
    )

    def __init__(self, *, strip_usage: bool, shown_model: str | None) -> None:
        self._strip_usage = strip_usage
        self._model = shown_model
        self._tail = b""
        self._id = ""
        self._created = int(time.time())
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._tools: dict[int, int] = {}  # candidate index -> tool calls sent so far
        self._usage_meta: Any = None
        self.done = False
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.malformed: bytes | None = None

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event."""
        return self._tail

    def feed(self, chunk: bytes) -> bytes:
        """Take upstream bytes; return the OpenAI chunks they complete."""
        if self.done or self.malformed is not None:
            return b""
        events, self._tail = complete_events(self._tail, chunk)
        out: list[bytes] = []
        for event in events:
            payload = event_data(event)
            if not payload:
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict):
                self.malformed = event[:200]
                break
            out.extend(self._translate(obj))
            if self.done:
                break
        if out:
            self.chunks += 1
        return b"".join(out)

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _open(self, index: int) -> list[bytes]:
        if index in self._started:
            return []
        self._started.add(index)
        return [self._chunk(index, {"role": "assistant", "content": ""})]

    def _translate(self, response: dict[str, Any]) -> list[bytes]:
        if response.get("error") is not None:
            self.error = openai_error(response, 500)["error"]
            return [b"data: " + orjson.dumps({"error": self.error}) + b"\n\n"]
        if not self._id:
            self._id = completion_id(response)
            if self._model is None:
                self._model = response.get("modelVersion") or ""
        if response.get("usageMetadata") is not None:
            self._usage_meta = response["usageMetadata"]
        refusal = blocked_refusal(response)
        if refusal is not None:
            out = [*self._open(0), self._chunk(0, {"refusal": refusal}, "content_filter")]
            return out + self._end()
        out = []
        for position, candidate in enumerate(_list(response.get("candidates"))):
            if isinstance(candidate, dict):
                out.extend(self._candidate(candidate, _index(candidate, position)))
        if self._finished:  # one candidate: streams with n > 1 are refused
            out.extend(self._end())
        return out

    def _candidate(self, candidate: dict[str, Any], index: int) -> list[bytes]:
        out = self._open(index)
        text, calls = candidate_parts(candidate)
        if text:
            out.append(self._chunk(index, {"content": text}))
        if calls:
            sent = self._tools.get(index, 0)
            deltas = [{"index": sent + i, **call} for i, call in enumerate(calls)]
            self._tools[index] = sent + len(calls)
            out.append(self._chunk(index, {"tool_calls": deltas}))
        reason = candidate.get("finishReason")
        if reason and index not in self._finished:
            self._finished.add(index)
            out.append(self._chunk(index, {}, finish_reason(reason, bool(self._tools.get(index)))))
        return out

    def _end(self) -> list[bytes]:
        self.done = True
        self.usage = openai_usage(self._usage_meta) or openai_usage({})
        return closing_events(self._id, self._created, self._model, self.usage, strip_usage=self._strip_usage)

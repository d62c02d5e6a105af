"""Answers a broken upstream makes up instead of generating: the *answering* faults.

Each one is a fixed, short answer on the wire exactly as a misbehaving server sends it
(a 200 that is empty, an error object or cut-off JSON, an event that ends in ``}`` but
is not JSON, ``data: [DONE]`` inside the content, ``[DONE]`` with the connection held
open, headers and then nothing). They answer for every endpoint, stream or not; the
gateway must never pass one on as a success.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from local_backend.sim._responses_events import EventWriter

ANSWERING = ("empty_200", "error_200", "truncated_200", "invalid_200", "done_in_content", "done_no_close",
             "headers_hang")  # fmt: skip
"""The faults answered here (the first one given wins, like the other rejecting faults)."""

_SSE = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_JSON = {"Content-Type": "application/json"}
_DONE = b"data: [DONE]\n\n"
_PAUSE_S = 0.3  # between the first events and the fault: a client can see what came before
_INVALID = b'data: {"choices": [}\n\n'  # ends in "}" as a valid event does; not JSON
_TRICKY = "An SSE stream ends with a line that reads\n\ndata: [DONE]\n\nand then the server closes it."
_ERROR = {"error": {"message": "The server had an error while processing your request.",
                    "type": "server_error", "param": None, "code": None}}  # fmt: skip


class Canned(Exception):
    """Raised instead of generating; the endpoint wrapper answers with :func:`answer`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


async def answer(
    request: web.Request, record: dict[str, Any], finish: Callable[[dict[str, Any], str], None], name: str
) -> web.StreamResponse:
    """Write the answer of fault ``name``; ``record`` (the request's entry in the simulator's
    stats) says the endpoint, the model and whether to stream, ``finish`` closes it."""
    record["status"] = 200
    stream = bool(record.get("stream"))
    model = str(record.get("model") or "sim")
    whole = _whole(record["endpoint"], model, name)
    if not stream:
        if name == "headers_hang":
            held = web.StreamResponse(headers=_JSON)
            await held.prepare(request)
            await _hold_open()
        body = {
            "empty_200": b"",
            "error_200": orjson.dumps(_ERROR),
            "truncated_200": whole[: len(whole) // 2],
            "invalid_200": _INVALID[6:-2],
        }.get(name, whole)
        finish(record, name)
        return web.Response(body=body, headers=_JSON)
    real = web.StreamResponse(headers=_SSE)
    await real.prepare(request)
    # On /v1/responses: the same broken answer in the Responses API's typed events.
    resp: web.StreamResponse | EventWriter = (
        EventWriter(real, {"model": model}, model, _INVALID)
        if record["endpoint"] == "/v1/responses"
        else real
    )
    events = _Chunks(model)
    if name == "error_200":
        await resp.write(b"data: " + orjson.dumps(_ERROR) + b"\n\n")
    elif name == "truncated_200":
        await resp.write(events.role()[:-20])
    elif name == "invalid_200":
        # Two good events, then (a moment later, so they were forwarded) the bad one.
        await resp.write(events.role() + events.content("Hello"))
        await asyncio.sleep(_PAUSE_S)
        await resp.write(_INVALID + events.content(" world", "stop") + _DONE)
    elif name == "done_in_content":
        # The text the gateway must not take for the end; then the upstream goes away.
        await resp.write(events.role() + events.content(_TRICKY))
        await asyncio.sleep(_PAUSE_S)
        await resp.write(events.content(" More text follows."))
    elif name == "done_no_close":
        await resp.write(events.role() + events.content("Hello", "stop") + _DONE)
        await _hold_open()
    elif name == "headers_hang":
        await _hold_open()
    # empty_200 (and the ones above that end early): the stream ends with no [DONE].
    await resp.write_eof()
    finish(record, name)
    return real


async def _hold_open() -> None:
    """Keep the connection open, sending nothing, until the client leaves."""
    await asyncio.get_running_loop().create_future()


class _Chunks:
    def __init__(self, model: str) -> None:
        self._base: dict[str, Any] = {
            "id": "chatcmpl-canned",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def _event(self, delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**self._base, "choices": [choice]}) + b"\n\n"

    def role(self) -> bytes:
        return self._event({"role": "assistant", "content": ""}, None)

    def content(self, text: str, finish: str | None = None) -> bytes:
        return self._event({"content": text}, finish)


def _whole(endpoint: str, model: str, fault: str) -> bytes:
    """A valid non-stream answer of the endpoint (what ``done_*`` answer without a stream)."""
    usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    if endpoint.endswith("/embeddings"):
        data = [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]
        return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
    text = _TRICKY if fault == "done_in_content" else "Hello world"
    if endpoint == "/v1/completions":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
        obj = "text_completion"
    else:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        obj = "chat.completion"
    body = {"id": "chatcmpl-canned", "object": obj, "created": int(time.time()), "model": model}
    return orjson.dumps({**body, "choices": [choice], "usage": usage})

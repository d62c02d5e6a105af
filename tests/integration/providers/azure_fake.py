"""A fake Azure OpenAI resource on loopback, written from Azure OpenAI's public REST reference.

It serves chat completions at both URL forms and checks what Azure checks:

- ``/openai/v1/chat/completions``: the model in the body; ``api-version`` optional;
- ``/openai/deployments/{deployment}/chat/completions?api-version=...``: the deployment in
  the path picks the model; without ``api-version`` Azure answers 404;
- auth: the ``api-key`` header, or ``Authorization: Bearer <Entra ID token>``; else 401;
- content filtering: ``prompt_filter_results`` on answers and on a stream's first chunk (with
  empty ``choices``, ``id`` and ``model``), ``content_filter_results`` on every choice; a
  prompt containing ``FILTER-PROMPT`` is refused with Azure's 400 ``content_filter`` error, and
  one containing ``FILTER-OUTPUT`` ends with ``finish_reason: content_filter``;
- throttling: a prompt containing ``THROTTLE-<n>`` is answered 429 (``retry-after-ms``,
  ``Retry-After``, ``x-ratelimit-remaining-*``) the first ``n`` times it is seen;
- usage: ``prompt_tokens_details.cached_tokens`` counts a prompt seen before as cached;
- tools: with ``tools``, the answer calls the first; ``response_format: json_schema``: the
  answer is an object with each required property of the schema.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
from aiohttp import web

from tests.fixtures.threaded_app import ThreadedApp

KEY = "azure-test-key"
TOKEN = "entra-test-token"
MODEL = "gpt-4o-2024-08-06"
_SAFE = {"filtered": False, "severity": "safe"}
_CATEGORIES = ("hate", "self_harm", "sexual", "violence")


def _filter_results(filtered: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {c: dict(_SAFE) for c in _CATEGORIES}
    if filtered is not None:
        out[filtered] = {"filtered": True, "severity": "high"}
    return out


def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
    body = {"error": {"code": code, "message": message, "status": status, **extra}}
    return web.json_response(body, status=status)


class FakeAzure(ThreadedApp):
    """The fake resource, served from a thread; ``requests`` keeps what each request sent."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []
        self.seen: dict[str, int] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/openai/v1/chat/completions", self._v1)
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._deployment)

    async def _v1(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if not isinstance(body.get("model"), str):
            return _error(400, "BadRequest", "model is required")
        return await self._chat(request, body, body["model"])

    async def _deployment(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if "api-version" not in request.query:
            return _error(404, "404", "Resource not found")
        return await self._chat(request, body, request.match_info["deployment"])

    async def _record(self, request: web.Request) -> dict[str, Any]:
        body = orjson.loads(await request.read())
        self.requests.append(
            {
                "path": request.path,
                "query": dict(request.query),
                "headers": dict(request.headers),
                "body": body,
            }
        )
        return body  # type: ignore[no-any-return]

    async def _chat(self, request: web.Request, body: dict[str, Any], model: str) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if request.headers.get("api-key") != KEY and auth != f"Bearer {TOKEN}":
            return _error(401, "401", "Access denied due to invalid subscription key or wrong API endpoint.")
        prompt = " ".join(str(m.get("content")) for m in body.get("messages", []))
        throttle = re.search(r"THROTTLE-(\d+)", prompt)
        seen = self.seen[prompt] = self.seen.get(prompt, 0) + 1
        if throttle and seen <= int(throttle.group(1)):
            resp = _error(
                429, "429", "Requests have exceeded the token rate limit. Please retry after 3 seconds."
            )
            resp.headers.update(
                {
                    "retry-after-ms": "200",
                    "Retry-After": "3",
                    "x-ratelimit-remaining-requests": "10",
                    "x-ratelimit-remaining-tokens": "0",
                }
            )
            return resp
        if "FILTER-PROMPT" in prompt:
            return _error(
                400,
                "content_filter",
                "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
                param="prompt",
                type=None,
                innererror={
                    "code": "ResponsibleAIPolicyViolation",
                    "content_filter_result": _filter_results("violence"),
                },
            )
        finish = "content_filter" if "FILTER-OUTPUT" in prompt else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": "Hello from Azure."}
        tools = body.get("tools")
        if tools:
            name = tools[0]["function"]["name"]
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": name, "arguments": '{"city": "Oslo"}'},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema")
        if schema:
            message["content"] = orjson.dumps({k: "x" for k in schema.get("required", [])}).decode()
        prompt_tokens = max(1, len(prompt) // 4)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 4,
            "total_tokens": prompt_tokens + 4,
            "prompt_tokens_details": {"cached_tokens": prompt_tokens if seen > 1 else 0},
        }
        prompt_filter = [{"prompt_index": 0, "content_filter_results": _filter_results()}]
        choice_filter = _filter_results("violence" if finish == "content_filter" else None)
        base = {
            "id": "chatcmpl-az1",
            "created": int(time.time()),
            "model": MODEL,
            "system_fingerprint": "fp_az",
        }
        headers = {
            "x-ratelimit-remaining-requests": "99",
            "x-ratelimit-remaining-tokens": "9000",
            "apim-request-id": "r1",
        }
        if not body.get("stream"):
            answer = {
                **base,
                "object": "chat.completion",
                "prompt_filter_results": prompt_filter,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": finish,
                        "content_filter_results": choice_filter,
                    }
                ],
                "usage": usage,
            }
            return web.json_response(answer, headers=headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        chunks: list[dict[str, Any]] = [
            {
                "choices": [],
                "created": 0,
                "id": "",
                "model": "",
                "object": "",
                "prompt_filter_results": prompt_filter,
            }
        ]
        chunk = {**base, "object": "chat.completion.chunk"}
        if message.get("tool_calls"):
            deltas: list[dict[str, Any]] = [
                {"role": "assistant", "tool_calls": [{"index": 0, **message["tool_calls"][0]}]}
            ]
        else:
            words = str(message["content"]).split(" ")
            deltas = [{"role": "assistant", "content": ""}] + [{"content": w + " "} for w in words]
        for delta in deltas:
            chunks.append(
                {
                    **chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": delta,
                            "finish_reason": None,
                            "content_filter_results": _filter_results(),
                        }
                    ],
                }
            )
        chunks.append(
            {
                **chunk,
                "choices": [
                    {
                        "index": 0,
                        "delta": {},
                        "finish_reason": finish,
                        "content_filter_results": choice_filter,
                    }
                ],
            }
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**chunk, "choices": [], "usage": usage})
        for item in chunks:
            await resp.write(b"data: " + orjson.dumps(item) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

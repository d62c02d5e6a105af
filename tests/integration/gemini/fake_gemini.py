"""A fake Gemini API (and Vertex AI) upstream: a real aiohttp server on loopback, in a thread.

Written from Google's public API reference, not from any SDK:

- ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``
  with ``x-goog-api-key`` (missing: 403 ``PERMISSION_DENIED``; wrong: 400
  ``INVALID_ARGUMENT`` with ``ErrorInfo.reason`` ``API_KEY_INVALID``, as the API answers);
- ``POST /v1/projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent``
  (Vertex AI) with ``Authorization: Bearer {token}`` (wrong: 401 ``UNAUTHENTICATED``), and the
  GCP metadata server's ``GET /computeMetadata/v1/instance/service-accounts/default/token``
  (header ``Metadata-Flavor: Google``) handing out the tokens it then accepts;
- the request shape checked as the API does: known top-level and ``generationConfig`` fields
  only ("Unknown name ... Cannot find field"), ``contents`` roles ``user``/``model``, one data
  field per part, as many ``functionResponse`` parts as the model turn had ``functionCall``
  parts, ``responseJsonSchema`` only with ``responseMimeType: application/json``, a
  ``thoughtSignature`` on every function call a ``gemini-3`` model made;
- answers: text, function calls (arguments built from the declared schema, in its
  ``propertyOrdering``), JSON built from ``responseJsonSchema``, ``MAX_TOKENS``,
  a ``SAFETY`` finish (prompt containing "unsafe answer") and a blocked prompt
  (``promptFeedback.blockReason``, prompt containing "blocked prompt");
- ``usageMetadata`` with implicit caching: a system instruction seen before, of at least
  :data:`MIN_CACHE_TOKENS`, comes back as ``cachedContentTokenCount``;
- injected failures: Google's error JSON (:meth:`FakeGemini.fail_next`; 429
  ``RESOURCE_EXHAUSTED`` with a ``RetryInfo.retryDelay``), a stream that closes before its
  ``finishReason`` (:meth:`FakeGemini.cut_next_stream`).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fixtures.threaded_app import ThreadedApp

API_KEY = "gemini-test-key"
VERTEX_TOKEN = "ya29.vertex-test-token"
MIN_CACHE_TOKENS = 1024
SIGNATURE = "c2lnbmVkIGJ5IHRoZSBmYWtlIGdlbWluaS8+Pz8+"  # standard base64 with '+' and '/'

_TOP_LEVEL = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings"}
_GENERATION = {
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "seed",
    "candidateCount",
    "stopSequences",
    "presencePenalty",
    "frequencyPenalty",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "thinkingConfig",
}
_PART_DATA = {"text", "inlineData", "fileData", "functionCall", "functionResponse"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")


class _Bad(Exception):
    def __init__(self, status: int, code: str, message: str, details: list[Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details or []


def _error(status: int, code: str, message: str, details: list[Any] | None = None) -> web.Response:
    body = {"error": {"code": status, "message": message, "status": code, "details": details or []}}
    return web.json_response(body, status=status)


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _example(schema: Any) -> Any:
    """A value that fits ``schema`` (object keys in its ``propertyOrdering``)."""
    if not isinstance(schema, dict):
        return "x"
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        order = schema.get("propertyOrdering") or list(properties)
        return {name: _example(properties[name]) for name in order}
    if kind == "array":
        return [_example(schema.get("items"))]
    return {"integer": 3, "number": 1.5, "boolean": True}.get(str(kind), "sample")


@dataclass
class Seen:
    """One request the fake received."""

    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class FakeGemini(ThreadedApp):
    """The fake upstream (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Seen] = []
        self._faults: list[tuple[int, str, str, list[Any]]] = []
        self._systems: set[str] = set()
        self._cut = False
        self.issued: list[str] = []
        self.token_lifetime_s = 3599

    @property
    def gemini_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1beta"

    def vertex_url(self, project: str = "proj-1", region: str = "europe-west4") -> str:
        return f"http://127.0.0.1:{self.port}/v1/projects/{project}/locations/{region}/publishers/google"

    def fail_next(self, status: int, code: str, message: str = "", *, retry_delay: str | None = None) -> None:
        """The next request is answered with Google's error JSON."""
        details: list[Any] = []
        if retry_delay is not None:
            details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
        self._faults.append((status, code, message or f"injected {code}", details))

    def cut_next_stream(self) -> None:
        """The next stream closes after its first event, before any ``finishReason``."""
        self._cut = True

    def reset(self) -> None:
        self.requests.clear()
        self._faults.clear()
        self._systems.clear()
        self._cut = False
        self.token_lifetime_s = 3599

    # --- the server -------------------------------------------------------------------

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1beta/models/{call}", self._gemini)
        app.router.add_post("/v1/projects/{p}/locations/{l}/publishers/google/models/{call}", self._vertex)
        app.router.add_get("/computeMetadata/v1/instance/service-accounts/default/token", self._token)

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("x-goog-api-key")
        if key is None:
            return _error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers.")
        if key != API_KEY:
            info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
            return _error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", [info])
        return await self._serve(request)

    async def _token(self, request: web.Request) -> web.StreamResponse:
        # The metadata server answers only requests that say they mean it.
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.")
        self.issued.append(f"ya29.metadata-{len(self.issued) + 1}")
        token = {"access_token": self.issued[-1], "expires_in": self.token_lifetime_s, "token_type": "Bearer"}
        return web.json_response(token)

    async def _vertex(self, request: web.Request) -> web.StreamResponse:
        tokens = {f"Bearer {t}" for t in (VERTEX_TOKEN, *self.issued)}
        if request.headers.get("Authorization") not in tokens:
            return _error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        return await self._serve(request)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(Seen(request.path, request.query_string, dict(request.headers), body))
        if self._faults:
            status, code, message, details = self._faults.pop(0)
            return _error(status, code, message, details)
        model, _, method = request.match_info["call"].partition(":")
        stream = method == "streamGenerateContent"
        if method not in ("generateContent", "streamGenerateContent"):
            return _error(404, "NOT_FOUND", f"Method {method} not found.")
        if stream and request.query.get("alt") != "sse":
            return _error(400, "INVALID_ARGUMENT", "this fake serves streams as alt=sse only")
        try:
            self._check(body, model)
            answer = self._answer(body, model)
        except _Bad as bad:
            return _error(bad.status, bad.code, bad.message, bad.details)
        if not stream:
            return web.json_response(answer)
        return await self._stream(request, answer)

    async def _stream(self, request: web.Request, answer: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = []
        candidates = answer.get("candidates") or []
        if candidates and candidates[0]["content"]["parts"][0].get("text") and len(candidates) == 1:
            # Text arrives in pieces; the last event carries the finish reason and usage.
            text = candidates[0]["content"]["parts"][0]["text"]
            middle = max(1, len(text) // 2)
            for piece in (text[:middle], text[middle:]):
                events.append({"candidates": [{"content": {"role": "model", "parts": [{"text": piece}]}}]})
            events[-1]["candidates"][0]["finishReason"] = candidates[0]["finishReason"]
            events[-1]["usageMetadata"] = answer["usageMetadata"]
        else:
            events.append(answer)
        if self._cut:
            self._cut = False
            events = events[:1]
            events[0].get("candidates", [{}])[0].pop("finishReason", None)
        for event in events:
            event["modelVersion"] = answer["modelVersion"]
            event["responseId"] = answer["responseId"]
            await resp.write(b"data: " + json.dumps(event).encode() + b"\r\n\r\n")
        await resp.write_eof()
        return resp

    # --- what the API checks ------------------------------------------------------------

    def _check(self, body: dict[str, Any], model: str) -> None:
        for name in body:
            if name not in _TOP_LEVEL:
                raise _Bad(
                    400,
                    "INVALID_ARGUMENT",
                    f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.',
                )
        for name in body.get("generationConfig") or {}:
            if name not in _GENERATION:
                raise _Bad(
                    400,
                    "INVALID_ARGUMENT",
                    f"Invalid JSON payload received. Unknown name \"{name}\" at 'generation_config': Cannot find field.",
                )
        config = body.get("generationConfig") or {}
        if "responseJsonSchema" in config and config.get("responseMimeType") != "application/json":
            raise _Bad(400, "INVALID_ARGUMENT", "responseJsonSchema needs responseMimeType application/json")
        if "responseJsonSchema" in config and "responseSchema" in config:
            raise _Bad(
                400, "INVALID_ARGUMENT", "responseSchema and responseJsonSchema are mutually exclusive"
            )
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise _Bad(
                400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified"
            )
        calls_pending = 0
        for i, content in enumerate(contents):
            if content.get("role") not in ("user", "model"):
                raise _Bad(400, "INVALID_ARGUMENT", f"contents[{i}].role must be user or model")
            parts = content.get("parts")
            if not parts:
                raise _Bad(400, "INVALID_ARGUMENT", f"contents[{i}].parts must not be empty")
            for part in parts:
                if len(_PART_DATA & set(part)) != 1:
                    raise _Bad(400, "INVALID_ARGUMENT", f"contents[{i}]: a part needs exactly one data field")
                if (
                    "functionCall" in part
                    and model.startswith("gemini-3")
                    and part.get("thoughtSignature") != SIGNATURE
                ):
                    raise _Bad(
                        400,
                        "INVALID_ARGUMENT",
                        f"Function call is missing a thought_signature in functionCall parts (contents[{i}]).",
                    )
            responses = sum("functionResponse" in p for p in parts)
            if calls_pending and responses != calls_pending:
                raise _Bad(
                    400,
                    "INVALID_ARGUMENT",
                    "Please ensure that the number of function response parts is equal to the number of "
                    "function call parts of the function call turn.",
                )
            calls_pending = sum("functionCall" in p for p in parts) if content["role"] == "model" else 0
        for tool in body.get("tools") or ():
            for declaration in tool.get("functionDeclarations") or ():
                if not _NAME.match(str(declaration.get("name"))):
                    raise _Bad(400, "INVALID_ARGUMENT", f"bad function name {declaration.get('name')!r}")
                if "parameters" in declaration and "parametersJsonSchema" in declaration:
                    raise _Bad(
                        400, "INVALID_ARGUMENT", "parameters and parametersJsonSchema are mutually exclusive"
                    )

    # --- what it answers ----------------------------------------------------------------

    def _usage(self, body: dict[str, Any], output: str) -> dict[str, Any]:
        system = "".join(p.get("text", "") for p in (body.get("systemInstruction") or {}).get("parts", ()))
        rest = json.dumps(body.get("contents")) + json.dumps(body.get("tools") or "")
        prompt = _tokens(system) + _tokens(rest) if system else _tokens(rest)
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": _tokens(output)}
        if system and _tokens(system) >= MIN_CACHE_TOKENS:
            if system in self._systems:
                usage["cachedContentTokenCount"] = _tokens(system)
            self._systems.add(system)
        usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"]
        return usage

    def _answer(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        last = body["contents"][-1]
        prompt = " ".join(p.get("text", "") for p in last["parts"])
        config = body.get("generationConfig") or {}
        base = {"modelVersion": f"{model}-001", "responseId": f"resp-{len(self.requests)}"}
        if "blocked prompt" in prompt:
            usage = {"promptTokenCount": _tokens(prompt), "totalTokenCount": _tokens(prompt)}
            return {**base, "promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage}
        parts: list[dict[str, Any]]
        finish = "STOP"
        responses = [p["functionResponse"] for p in last["parts"] if "functionResponse" in p]
        declarations = [d for t in body.get("tools") or () for d in t.get("functionDeclarations") or ()]
        mode = ((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode", "AUTO")
        if responses:
            text = "Results: " + "; ".join(f"{r['name']}={json.dumps(r['response'])}" for r in responses)
            parts = [{"text": text}]
        elif declarations and mode != "NONE" and (mode == "ANY" or "call" in prompt):
            allowed = (
                body["toolConfig"]["functionCallingConfig"].get("allowedFunctionNames")
                if mode == "ANY"
                else None
            )
            chosen = [d for d in declarations if not allowed or d["name"] in allowed]
            count = 2 if "both" in prompt else 1
            parts = []
            for declaration in (chosen * 2)[:count]:
                call = {
                    "name": declaration["name"],
                    "args": _example(declaration.get("parametersJsonSchema") or {}),
                }
                part: dict[str, Any] = {"functionCall": call}
                if model.startswith("gemini-3"):
                    part["thoughtSignature"] = SIGNATURE
                parts.append(part)
        elif config.get("responseMimeType") == "application/json":
            parts = [{"text": json.dumps(_example(config.get("responseJsonSchema") or {"type": "object"}))}]
        else:
            text = f"Hello from {model}: you said {prompt[:40]}"
            if "unsafe answer" in prompt:
                text, finish = "I was about to", "SAFETY"
            limit = config.get("maxOutputTokens")
            if limit is not None and _tokens(text) > limit:
                text, finish = text[: limit * 4], "MAX_TOKENS"
            parts = [{"text": text}]
        output = json.dumps(parts)
        usage = self._usage(body, output)
        if model.startswith("gemini-3"):
            usage["thoughtsTokenCount"] = 7
            usage["totalTokenCount"] += 7
        count = config.get("candidateCount", 1)
        candidates = [
            {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": i}
            for i in range(count)
        ]
        return {**base, "candidates": candidates, "usageMetadata": usage}

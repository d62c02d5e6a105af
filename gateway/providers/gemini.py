"""Google's Gemini API and Vertex AI behind the gateway's chat completions.

Both speak one dialect (``generateContent``, ``streamGenerateContent?alt=sse``): a
chat-completions request is translated (:mod:`gateway.dialects.gemini.request`) and the
answer, its stream and its errors come back as chat completions
(:mod:`gateway.dialects.gemini.response`). What differs is the URL and the credential:

- ``provider: gemini``: ``base_url`` ``https://generativelanguage.googleapis.com/v1beta``,
  the API key from ``api_key_env`` sent as ``x-goog-api-key`` (never as ``Authorization``);
- ``provider: vertex``: ``base_url``
  ``https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}/publishers/google``,
  an OAuth access token sent as ``Authorization: Bearer``: from ``api_key_env``, or with
  ``google_auth: metadata`` from the GCP metadata server.

Errors: Google's error object is rewritten to OpenAI's before dispatch reads it, so a 429
``RESOURCE_EXHAUSTED`` is a rate limit whose ``RetryInfo.retryDelay`` becomes the
``Retry-After`` the one parser reads (:mod:`gateway.dispatch.backoff`), a 500/503 an
upstream fault, a 400 ``INVALID_ARGUMENT`` the client's bad request with Google's message,
and a 400 ``API_KEY_INVALID`` (how the Gemini API answers a wrong key) or a 401/403 the
gateway's own credential failure.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson
from multidict import CIMultiDict

from gateway.dialects.gemini.request import to_generate_request, unsupported
from gateway.dialects.gemini.response import (
    GeminiStreamScanner,
    error_details,
    openai_error,
    seconds,
    to_chat_completion,
)
from gateway.dispatch.failures import failure
from gateway.errors import SwitchyardError
from gateway.providers.base import Answer, CacheHints, PreparedRequest, Provider, json_answer, wants_usage
from gateway.providers.clients import http_transport
from gateway.providers.google_token import MetadataToken
from gateway.providers.transport import Transport, TransportResponse

if TYPE_CHECKING:
    from gateway.policy import Deployment

_AUTH_REASONS = frozenset({"API_KEY_INVALID", "API_KEY_EXPIRED", "ACCESS_TOKEN_EXPIRED"})
"""``ErrorInfo.reason`` values of a 400 that is really a bad credential."""

_MAX_ERROR_BYTES = 64 * 1024
"""An error body is read whole to be rewritten; one past this is cut (Google's are ~1 KB)."""


class _Request(dict[str, Any]):
    """A translated request body, with what the send needs that is not part of it."""

    def __init__(self, body: dict[str, Any], *, stream: bool, error: SwitchyardError | None = None) -> None:
        super().__init__(body)
        self.stream = stream
        self.error = error


class _GoogleError(TransportResponse):
    """An error answer, read whole and rewritten in OpenAI's shape (see the module docstring)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        try:
            obj: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = {"error": {"message": body[:500].decode("utf-8", "replace")}}
        delay, reason = error_details(obj)
        self.status = 401 if status == 400 and reason in _AUTH_REASONS else status
        self.headers = CIMultiDict(headers)
        retry_after = seconds(delay) if delay else None
        if retry_after is not None:
            self.headers["Retry-After"] = retry_after
        self._body = orjson.dumps(openai_error(obj, self.status))

    async def read(self) -> bytes:
        return self._body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    def complete(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass


async def _read_error(resp: TransportResponse) -> bytes:
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.iter_chunks():
            parts.append(chunk)
            size += len(chunk)
            if size > _MAX_ERROR_BYTES:
                resp.close()
                return b"".join(parts)[:_MAX_ERROR_BYTES]
    except BaseException:
        resp.close()
        raise
    resp.release()
    return b"".join(parts)


class GeminiProvider(Provider):
    """``provider: gemini``: the Gemini API with an API key (``x-goog-api-key``)."""

    def __init__(self, name: str, deployment: Deployment, transport: Transport | None = None) -> None:
        if transport is None:
            transport = http_transport(deployment.base_url, self.keyed(deployment))
        super().__init__(name, deployment, transport)
        # The API's resource name (models/gemini-2.5-flash) and the bare id both work.
        model = self.upstream_model.removeprefix("models/")
        self._path = "/models/" + quote(model, safe="-._~@")

    @staticmethod
    def keyed(deployment: Deployment) -> Deployment:
        """``deployment`` with its key moved to the header this API reads it from."""
        key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
        headers = dict(deployment.headers)
        if key:
            headers["x-goog-api-key"] = key
        return deployment.model_copy(update={"api_key_env": None, "headers": headers})

    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        try:
            request = to_generate_request(body)
        except SwitchyardError as exc:
            return PreparedRequest(_Request({}, stream=stream, error=exc))
        return PreparedRequest(_Request(request, stream=stream), strip_usage=stream and not wants_usage(body))

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        if isinstance(body, _Request) and body.error is not None:
            raise body.error
        if endpoint != "/chat/completions":
            raise unsupported("endpoint", f"{endpoint} has no Gemini equivalent")
        stream = isinstance(body, _Request) and body.stream
        method = ":streamGenerateContent?alt=sse" if stream else ":generateContent"
        resp = await self.transport.send(
            self._path + method, body, headers=headers, connect_timeout_s=connect_timeout_s
        )
        if resp.status < 400:
            return resp
        return _GoogleError(resp.status, resp.headers, await _read_error(resp))

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> GeminiStreamScanner:
        return GeminiStreamScanner(strip_usage=strip_usage, shown_model=shown_model)

    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        name = self.name
        response = json_answer(name, body)
        if isinstance(response, dict) and response.get("error") is not None:
            error = openai_error(response, 500)["error"]
            raise failure(
                "error_answer",
                f"deployment '{name}' answered 200 with an error ({error['code']}): {error['message'][:200]}",
            )
        if not isinstance(response, dict) or not (
            response.get("candidates") or response.get("promptFeedback")
        ):
            raise failure(
                "invalid_answer", f"deployment '{name}' answered 200 without candidates or promptFeedback"
            )
        completion = to_chat_completion(response, shown_model)
        return Answer(orjson.dumps(completion), completion["usage"])


class VertexProvider(GeminiProvider):
    """``provider: vertex``: Gemini on Vertex AI with an OAuth access token as the bearer:
    from ``api_key_env`` (``google_auth: env``, the default ``Authorization`` header every
    transport sends) or from the metadata server (``google_auth: metadata``, refreshed
    before it expires: :mod:`gateway.providers.google_token`)."""

    def __init__(self, name: str, deployment: Deployment, transport: Transport | None = None) -> None:
        super().__init__(name, deployment, transport)
        self.token = MetadataToken(name) if deployment.google_auth == "metadata" else None

    @staticmethod
    def keyed(deployment: Deployment) -> Deployment:
        return deployment

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        if self.token is not None and not (isinstance(body, _Request) and body.error is not None):
            headers = {**headers, "Authorization": f"Bearer {await self.token.bearer()}"}
        return await super().send(endpoint, body, headers=headers, connect_timeout_s=connect_timeout_s)

    async def close(self) -> None:
        if self.token is not None:
            await self.token.close()
        await super().close()

"""Anthropic's dialect: the Messages API behind the gateway's chat completions.

A chat-completions request is translated to a Messages request
(:mod:`gateway.dialects.anthropic.request`), cache breakpoints are placed from shaping's
stable prefix (:mod:`gateway.shaping.breakpoints`), and the answer or its stream comes
back as chat completions (:mod:`gateway.dialects.anthropic.response`). Auth is
``x-api-key`` from the deployment's ``api_key_env`` plus ``anthropic-version``; an HTTP 529
``overloaded_error`` is an overload: it reaches dispatch as a 503 (with Anthropic's body), so
``retries.retry_on``, circuits, spans and logs treat it as one without a row of its own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from gateway.dialects.anthropic.request import late_system_blocks, to_messages_request, unsupported
from gateway.dialects.anthropic.response import MessagesStreamScanner, openai_error, to_chat_completion
from gateway.dispatch.failures import failure, http_failure
from gateway.errors import SwitchyardError
from gateway.providers.base import Answer, CacheHints, PreparedRequest, Provider, json_answer, wants_usage
from gateway.providers.clients import http_transport
from gateway.providers.transport import Transport, TransportResponse
from gateway.shaping.breakpoints import place_breakpoints, split_stable_system

if TYPE_CHECKING:
    from gateway.policy import Deployment

OVERLOADED = 529
"""Anthropic's status for an overloaded API (``overloaded_error``)."""


class _Refused(dict[str, Any]):
    """A request the deployment cannot take: :meth:`AnthropicProvider.send` raises its error,
    inside the attempt, so the connection accounting around a send stays as it is."""

    def __init__(self, error: SwitchyardError) -> None:
        super().__init__()
        self.error = error


class _Overloaded(TransportResponse):
    """A 529 answer seen as the 503 it means (see the module docstring)."""

    def __init__(self, resp: TransportResponse) -> None:
        self._resp = resp
        self.status = 503
        self.headers = resp.headers

    async def read(self) -> bytes:
        return await self._resp.read()

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self._resp.iter_chunks()

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class AnthropicProvider(Provider):
    """``provider: anthropic``: ``base_url`` is the API prefix (``https://api.anthropic.com/v1``)."""

    def __init__(self, name: str, deployment: Deployment, transport: Transport | None = None) -> None:
        if transport is None:
            headers = {**deployment.headers, "anthropic-version": deployment.anthropic_version}
            key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
            if key:
                headers["x-api-key"] = key
            # The key goes in x-api-key, never in an Authorization header.
            keyed = deployment.model_copy(update={"api_key_env": None, "headers": headers})
            transport = http_transport(deployment.base_url, keyed)
        super().__init__(name, deployment, transport)

    @property
    def places_breakpoints(self) -> bool:
        """Whether the gateway adds cache breakpoints (``cache_breakpoints``, on by default here)."""
        return self.deployment.cache_breakpoints is not False

    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        deployment = self.deployment
        try:
            request = to_messages_request(
                body,
                model=self.upstream_model,
                default_max_tokens=deployment.max_tokens,
                structured_outputs=deployment.structured_outputs,
                temperature_with_top_p=deployment.temperature_with_top_p,
            )
        except SwitchyardError as exc:
            return PreparedRequest(_Refused(exc))
        if stream:
            request["stream"] = True
        if self.places_breakpoints:
            system = request.get("system")
            stable = 0
            if isinstance(system, list) and hints is not None:
                stable = split_stable_system(system, hints.head_stable_chars, hints.head_stable_parts)
            place_breakpoints(
                request,
                stable_system_blocks=stable,
                min_tokens=deployment.min_cache_tokens,
                ttl=deployment.cache_ttl,
                late_blocks=late_system_blocks(body.get("messages")),
            )
        return PreparedRequest(request, strip_usage=stream and not wants_usage(body))

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        if isinstance(body, _Refused):
            raise body.error
        if endpoint != "/chat/completions":
            raise unsupported("endpoint", f"{endpoint} has no Messages API equivalent")
        resp = await self.transport.send(
            "/messages", body, headers=headers, connect_timeout_s=connect_timeout_s
        )
        return _Overloaded(resp) if resp.status == OVERLOADED else resp

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> MessagesStreamScanner:
        return MessagesStreamScanner(strip_usage=strip_usage, shown_model=shown_model)

    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        name = self.name
        message = json_answer(name, body)
        if isinstance(message, dict) and (message.get("type") == "error" or message.get("error") is not None):
            error = openai_error(message)["error"]
            raise failure(
                "error_answer",
                f"deployment '{name}' answered 200 with an error ({error['type']}): {error['message'][:200]}",
            )
        if not isinstance(message, dict) or message.get("type") != "message":
            raise failure(
                "invalid_answer", f"deployment '{name}' answered 200 with something other than a message"
            )
        completion = to_chat_completion(message, shown_model)
        return Answer(orjson.dumps(completion), completion["usage"])

    def status_failure(self, status: int) -> str:
        # 529 overloaded_error: the API is busy, not broken; retried and failed over like a 503.
        return "503" if status == OVERLOADED else http_failure(status)

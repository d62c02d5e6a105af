"""The OpenAI-compatible providers: OpenAI's dialect with each one's quirks applied from its
row of :data:`gateway.providers.presets.PRESETS` (the policy's ``provider:`` names it, e.g.
``provider: deepseek``): cached prompt tokens reported elsewhere than OpenAI's
``usage.prompt_tokens_details.cached_tokens`` are put there, request fields the provider
rejects although nothing is lost without them are dropped, and those it cannot honour are
refused with a 400 before a request is spent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequestError
from gateway.providers.base import Answer, CacheHints, PreparedRequest
from gateway.providers.openai import OpenAIProvider, check_answer
from gateway.providers.presets import PRESETS, Preset
from gateway.providers.sse import StreamScanner
from gateway.providers.transport import TransportResponse


class _Refused(dict[str, Any]):
    """A request the provider cannot honour: :meth:`CompatibleProvider.send` raises its error
    inside the attempt (as the Anthropic adapter does)."""

    def __init__(self, error: InvalidRequestError) -> None:
        super().__init__()
        self.error = error


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _harmless(field: str, value: Any) -> bool:
    """A refused field set to what leaving it out means (``n: 1``, ``logprobs: false``)."""
    return value is None or value is False or value in ({}, []) or (field == "n" and value == 1)


def normalised_usage(obj: Mapping[str, Any], usage: Any, preset: Preset) -> dict[str, Any] | None:
    """``usage`` with the provider's cached prompt tokens in
    ``prompt_tokens_details.cached_tokens`` (``obj`` is the answer or chunk it came from)."""
    if not isinstance(usage, dict):
        return None
    if not preset.cached_tokens:
        return usage
    cached = _dig(obj, preset.cached_tokens)
    details = usage.get("prompt_tokens_details")
    if not isinstance(cached, int) or (isinstance(details, dict) and "cached_tokens" in details):
        return usage
    known = details if isinstance(details, dict) else {}
    return {**usage, "prompt_tokens_details": {**known, "cached_tokens": cached}}


class CompatibleProvider(OpenAIProvider):
    """``provider: <a name in PRESETS>``: OpenAI's dialect with that provider's quirks.

    ``prompt_cache_key`` is never added (most of these providers reject or ignore it)."""

    sends_prompt_cache_key = False

    @property
    def preset(self) -> Preset:
        """This deployment's row of :data:`PRESETS`."""
        return PRESETS[self.deployment.provider]

    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        preset = self.preset
        for field in preset.refuse:
            if field in body and not _harmless(field, body[field]):
                error = InvalidRequestError(
                    f"deployment '{self.name}' (provider {self.deployment.provider}) does not support "
                    f"'{field}'" + (" other than 1" if field == "n" else ""),
                    param=field,
                    code="unsupported_parameter",
                )
                return PreparedRequest(_Refused(error))
        if preset.drop or preset.refuse:
            body = {k: v for k, v in body.items() if k not in preset.drop and k not in preset.refuse}
        if preset.drop_message_name and isinstance(body.get("messages"), list):
            messages = [
                {k: v for k, v in m.items() if k != "name"} if isinstance(m, dict) else m
                for m in body["messages"]
            ]
            body = {**body, "messages": messages}
        prepared = super().prepare(body, stream=stream, hints=hints)
        if "stream_options" in preset.drop and "stream_options" in prepared.body:
            # The provider sends usage at the end of every stream: nothing to ask for or strip.
            out = dict(prepared.body)
            del out["stream_options"]
            return PreparedRequest(out)
        return prepared

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
        return await super().send(endpoint, body, headers=headers, connect_timeout_s=connect_timeout_s)

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> StreamScanner:
        preset = self.preset
        if not preset.cached_tokens and preset.stream_usage == ("usage",):
            return super().scanner(strip_usage=strip_usage, shown_model=shown_model)
        return StreamScanner(
            strip_usage=strip_usage,
            model_from=self.upstream_model if shown_model is not None else None,
            model_to=shown_model,
            usage_of=lambda obj: normalised_usage(
                obj, _dig(obj, preset.stream_usage) or obj.get("usage"), preset
            ),
        )

    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        preset = self.preset
        if not preset.cached_tokens:
            return super().read_answer(body, content_type, shown_model, endpoint=endpoint)
        obj = check_answer(self.name, body, endpoint)
        raw = obj.get("usage")
        usage = normalised_usage(obj, raw, preset)
        changed = usage is not raw
        if changed:
            # Clients see OpenAI's field too, so cache-hit accounting reads the same everywhere.
            obj["usage"] = usage
        if shown_model is not None and "model" in obj:
            obj["model"] = shown_model
            changed = True
        return Answer(orjson.dumps(obj) if changed else body, usage, obj)

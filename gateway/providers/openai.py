"""OpenAI's dialect (Chat Completions, Completions, Embeddings), spoken by OpenAI itself and
most hosted and self-hosted providers: the request passes through with the deployment's
model name, streams are SSE ending in ``data: [DONE]``, usage is OpenAI's object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.dispatch.failures import failure
from gateway.providers.base import Answer, CacheHints, PreparedRequest, Provider, json_answer, wants_usage
from gateway.providers.sse import StreamScanner

_EPHEMERAL = {"type": "ephemeral"}


class OpenAIProvider(Provider):
    """``provider: openai``."""

    sends_prompt_cache_key = True
    """Whether the provider routes by ``prompt_cache_key`` (OpenAI does; others may reject it)."""

    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        model = self.upstream_model
        hinted = hints is not None and hints.prefix_hash
        ask_usage = stream and self.deployment.stream_usage and not wants_usage(body)
        if not hinted and not ask_usage and body.get("model") == model:
            # Nothing to change: the parsed body goes as it is (no copy; nothing writes to it).
            return PreparedRequest(body)
        out = dict(body, model=model)
        if hints is not None and hinted:
            self._add_cache_hints(out, hints)
        strip_usage = False
        if ask_usage:
            out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
            strip_usage = True
        return PreparedRequest(out, strip_usage)

    def _add_cache_hints(self, body: dict[str, Any], hints: CacheHints) -> None:
        """OpenAI's ``prompt_cache_key`` (the stable prefix's hash, when the client set none),
        and a ``cache_control`` breakpoint at the end of the stable prefix for a deployment
        with ``cache_breakpoints``."""
        if self.sends_prompt_cache_key and hints.prompt_cache_key and "prompt_cache_key" not in body:
            body["prompt_cache_key"] = hints.prefix_hash
        messages = body.get("messages")
        if not self.deployment.cache_breakpoints or not isinstance(messages, list) or not messages:
            return
        head = messages[0]
        content = head.get("content") if isinstance(head, dict) else None
        parts: list[Any] | None = None
        if isinstance(content, str) and hints.head_stable_chars:
            cut = hints.head_stable_chars
            parts = [{"type": "text", "text": content[:cut], "cache_control": _EPHEMERAL}]
            if content[cut:]:
                parts.append({"type": "text", "text": content[cut:]})
        elif (
            isinstance(content, list)
            and hints.head_stable_parts
            and isinstance(content[hints.head_stable_parts - 1], dict)
        ):
            parts = list(content)
            last = hints.head_stable_parts - 1
            parts[last] = {**parts[last], "cache_control": _EPHEMERAL}
        if parts is not None:
            body["messages"] = [{**head, "content": parts}, *messages[1:]]

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> StreamScanner:
        return StreamScanner(
            strip_usage=strip_usage,
            model_from=self.upstream_model if shown_model is not None else None,
            model_to=shown_model,
        )

    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        obj = check_answer(self.name, body, endpoint)
        usage = obj.get("usage")
        usage = usage if isinstance(usage, dict) else None
        if shown_model is not None and "model" in obj:
            obj["model"] = shown_model
            return Answer(orjson.dumps(obj), usage, obj)
        return Answer(body, usage, obj)


ANSWER_KEYS: Mapping[str, str] = {
    "/chat/completions": "choices",
    "/completions": "choices",
    "/embeddings": "data",
    "/responses": "output",
}
"""The field every successful answer of an endpoint has (an endpoint not listed: only
checked to be a JSON object that is not an error)."""


def check_answer(name: str, body: bytes, endpoint: str | None) -> dict[str, Any]:
    """A 200's body as a JSON object, or the failure that makes it no answer: empty
    (``empty_answer``), not the endpoint's JSON (``invalid_answer``: truncated, invalid,
    no ``choices``/``data``), or an error object (``error_answer``)."""
    obj = json_answer(name, body)
    if not isinstance(obj, dict):
        raise failure("invalid_answer", f"deployment '{name}' answered 200 with JSON that is not an object")
    error = obj.get("error")
    if error is not None or obj.get("object") == "error":
        detail = error if isinstance(error, dict) else obj
        message = detail.get("message")
        shown = message[:200] if isinstance(message, str) else "(no message)"
        raise failure(
            "error_answer",
            f"deployment '{name}' answered 200 with an error (code {detail.get('code')!r}): {shown}",
        )
    key = ANSWER_KEYS.get(endpoint or "")
    if key is not None and not isinstance(obj.get(key), list):
        raise failure("invalid_answer", f"deployment '{name}' answered 200 without '{key}'")
    return obj

"""Azure OpenAI: OpenAI's dialect behind Azure's URLs, keys and content filter.

- URLs: ``base_url`` is the resource endpoint (``https://{resource}.openai.azure.com``).
  ``azure.api: v1`` (the default) posts to ``/openai/v1/chat/completions`` with the model
  in the body, as OpenAI's SDK does; ``azure.api: deployments`` posts to
  ``/openai/deployments/{deployment}/chat/completions?api-version=...``, where the Azure
  deployment in the path picks the model.
- Auth: the key ``api_key_env`` names goes in the ``api-key`` header; or an Entra ID access
  token, read from the variable ``azure.token_env`` names (e.g. ``AZURE_OPENAI_AD_TOKEN``),
  goes in ``Authorization: Bearer``. Both are read when the deployment's client is built.
- Content filter: ``prompt_filter_results`` / ``content_filter_results`` in answers and
  stream chunks pass through untouched (they are extra fields OpenAI's SDKs keep); a
  ``finish_reason: content_filter`` is an answer like any other; Azure's 400 with code
  ``content_filter`` is relayed as OpenAI's error object (400, ``invalid_request_error``,
  code ``content_filter``, Azure's ``innererror`` kept): the client's request is refused, so
  it is neither retried nor counted against the deployment's circuit.
- Throttling: a 429's ``retry-after-ms``, ``Retry-After`` or ``x-ratelimit-reset-*`` headers
  (:func:`gateway.dispatch.backoff.retry_after_s`) say how long the deployment cools.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gateway.providers.azure_policy import DEFAULT_API_VERSION, AzureSettings
from gateway.providers.clients import http_transport
from gateway.providers.openai import OpenAIProvider
from gateway.providers.sse import StreamScanner
from gateway.providers.transport import Transport, TransportResponse

if TYPE_CHECKING:
    from gateway.policy import Deployment

_MODEL = re.compile(rb'"model": ?"([^"\\]+)"')


class _AzureScanner(StreamScanner):
    """Azure's chunks name the model version (``gpt-4o-2024-08-06``), not the deployment's
    ``model``: the ``model`` rewrite learns the name from the first chunk that has one (the
    prompt-filter chunk before it has ``""``)."""

    __slots__ = ("_shown",)

    def __init__(self, *, strip_usage: bool, shown_model: str | None) -> None:
        super().__init__(strip_usage=strip_usage)
        self._shown = shown_model

    def feed(self, chunk: bytes) -> bytes:
        if self._shown is not None:
            found = _MODEL.search(self.pending + chunk)
            if found is not None:
                self.rewrite_model(found.group(1).decode(), self._shown)
                self._shown = None
        return super().feed(chunk)


def azure_paths(deployment: Deployment, model: str) -> dict[str, str]:
    """Endpoint (``/chat/completions`` ...) -> the path and query Azure serves it at."""
    settings = deployment.azure or AzureSettings()
    version = settings.api_version
    if settings.api == "v1":
        prefix = "/openai/v1"
        responses = prefix + "/responses"
    else:
        version = version or DEFAULT_API_VERSION
        prefix = "/openai/deployments/" + quote(settings.deployment or model, safe="")
        # The Responses API is per resource, not per deployment, in the dated API.
        responses = "/openai/responses"
    query = f"?api-version={quote(version, safe='')}" if version else ""
    paths = {
        endpoint: prefix + endpoint + query
        for endpoint in ("/chat/completions", "/completions", "/embeddings")
    }
    paths["/responses"] = responses + query
    return paths


class AzureProvider(OpenAIProvider):
    """``provider: azure``: ``base_url`` is the resource endpoint, ``azure:`` the rest."""

    def __init__(self, name: str, deployment: Deployment, transport: Transport | None = None) -> None:
        if transport is None:
            headers = dict(deployment.headers)
            settings = deployment.azure or AzureSettings()
            if settings.token_env:
                token = os.environ.get(settings.token_env)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
            elif deployment.api_key_env:
                key = os.environ.get(deployment.api_key_env)
                if key:
                    headers["api-key"] = key
            # Azure's key goes in api-key, never in an Authorization header.
            keyed = deployment.model_copy(update={"api_key_env": None, "headers": headers})
            transport = http_transport(deployment.base_url, keyed)
        super().__init__(name, deployment, transport)
        self.paths = azure_paths(deployment, self.upstream_model)
        # The dated API rejects fields it does not know ("Unrecognized request argument").
        self.sends_prompt_cache_key = (deployment.azure or AzureSettings()).api == "v1"

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> StreamScanner:
        return _AzureScanner(strip_usage=strip_usage, shown_model=shown_model)

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        path = self.paths.get(endpoint, endpoint)
        return await self.transport.send(path, body, headers=headers, connect_timeout_s=connect_timeout_s)

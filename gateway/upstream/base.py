"""The interface between dispatch and a provider: OpenAI-format JSON in, OpenAI-format bytes out.

A provider adapter turns an OpenAI request body into its own wire format and its
answers back into OpenAI's bytes (a non-stream JSON body, or SSE events). The server
and dispatch only ever see OpenAI's format, so an adapter for a different API
(Anthropic Messages, say) is a new :class:`Upstream` subclass registered in
:data:`gateway.upstream.PROVIDERS`, and nothing else changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.policy import Deployment


class UpstreamResponse(ABC):
    """An answer whose headers arrived; the body is read or iterated, then closed."""

    status: int
    headers: Mapping[str, str]

    @abstractmethod
    async def read(self) -> bytes:
        """The whole body."""

    @abstractmethod
    def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, without waiting to fill a buffer."""

    @abstractmethod
    def close(self) -> None:
        """Drop the connection (an unfinished answer is never returned to the pool)."""

    @abstractmethod
    def release(self) -> None:
        """Return a fully read connection to the pool."""


class Upstream(ABC):
    """A client for one deployment, created once and shared by all requests to it."""

    def __init__(self, name: str, deployment: Deployment) -> None:
        self.name = name
        self.deployment = deployment
        self.upstream_model = deployment.model or name

    @property
    def ready(self) -> bool:
        """Whether requests can be sent now (a launched vLLM still loading its model cannot)."""
        return True

    @abstractmethod
    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> UpstreamResponse:
        """POST ``body`` (OpenAI format) to ``endpoint`` (``/chat/completions`` ...); return at headers."""

    @abstractmethod
    async def close(self) -> None:
        """Close pooled connections."""

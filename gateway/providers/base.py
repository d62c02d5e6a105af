"""The provider interface: an adapter owns one provider's whole dialect, plus its transport.

Dispatch speaks OpenAI's format (the request body it got, the bytes it forwards) and asks
the deployment's :class:`Provider` for everything that depends on who answers:

- :meth:`Provider.prepare`: the request as this provider wants it: its model name, its
  cache hints (``prompt_cache_key``, ``cache_control`` breakpoints), asking for usage on
  streams;
- :meth:`Provider.scanner`: the stream's framing, its end-of-stream rule (the end event
  itself, never a byte pattern inside content), a check that each event is complete
  before it is forwarded, the usage it reports, the response ``model`` rewrite (a
  :class:`Scanner` per stream);
- :meth:`Provider.read_answer`: the same for a whole (non-stream) answer, which it first
  checks to be one (a 200 that is empty, not the endpoint's JSON, or an error object
  fails the attempt like a 5xx: ``empty_answer``, ``invalid_answer``, ``error_answer``);
- :meth:`Provider.status_failure`: which of its error statuses means rate limited,
  overloaded, bad credentials or a bad request (a row of :mod:`gateway.dispatch.failures`);
- :meth:`Provider.send`: the HTTP call, through its :class:`~gateway.providers.transport.Transport`.

Adding a provider is one file: subclass :class:`Provider` (or
:class:`~gateway.providers.openai.OpenAIProvider` when it mostly speaks OpenAI's
dialect and overriding only what differs), add its name to
:data:`gateway.providers.registry.PROVIDERS` (``provider:`` in the policy is checked
against it), and test it against :class:`~gateway.providers.mock.MockTransport`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway.dispatch.failures import failure, http_failure
from gateway.providers.clients import http_transport
from gateway.providers.transport import Transport, TransportResponse

if TYPE_CHECKING:
    from gateway.policy import Deployment


def wants_usage(body: Mapping[str, Any]) -> bool:
    """Whether the client asked for usage on its stream (``stream_options.include_usage``):
    when not, the usage chunk the gateway asked the upstream for is stripped."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def json_answer(name: str, body: bytes) -> Any:
    """A 200's body parsed, or the failure that makes it no answer: empty (``empty_answer``) or
    not JSON (``invalid_answer``). What the JSON must hold is each provider's to check."""
    if not body.strip():
        raise failure("empty_answer", f"deployment '{name}' answered 200 with an empty body")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise failure(
            "invalid_answer", f"deployment '{name}' answered 200 with a body that is not JSON ({exc})"
        ) from None


@dataclass(frozen=True, slots=True)
class CacheHints:
    """What shaping found about the request's stable prefix, for the provider's cache hints."""

    prefix_hash: str
    head_stable_chars: int
    """Characters of the first message's string content that are stable (0: none)."""
    head_stable_parts: int
    """Leading parts of the first message's list content that are stable (0: none)."""
    prompt_cache_key: bool
    """The policy allows sending ``prompt_cache_key`` (``shaping.prompt_cache_key``)."""


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request body in the provider's dialect, and what the gateway added to it."""

    body: Mapping[str, Any]
    strip_usage: bool = False
    """The gateway asked for stream usage on the client's behalf: drop it before forwarding."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer as the client gets it, with the usage it reported (OpenAI's shape:
    ``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``)."""

    body: bytes
    usage: dict[str, Any] | None
    obj: dict[str, Any] | None = None
    """``body`` parsed, when reading it parsed it (the response cache reads it again)."""


class Scanner(Protocol):
    """Reads one streamed answer as it passes through: feed bytes, forward what comes back.

    A scanner cuts the stream at event boundaries (an event is never split across two
    writes), applies the response ``model`` rewrite, and records what the gateway needs.
    """

    done: bool
    """The provider's end-of-stream event arrived: the answer is complete (nothing after
    it is forwarded)."""
    chunks: int
    """Blocks of complete events forwarded so far."""
    usage: dict[str, Any] | None
    """The usage the stream reported (OpenAI's shape), once it did."""
    error: dict[str, Any] | None
    """An error event the provider sent inside the stream."""
    malformed: bytes | None
    """The start of an event that is not valid (not complete JSON); the stream must end
    with an error. The scanner checks every event before returning it."""

    def feed(self, chunk: bytes) -> bytes:
        """Take upstream bytes; return the bytes to forward now (possibly none)."""

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event (a cut-off event)."""


class Provider(ABC):
    """One deployment's provider: its dialect and its transport, created once per deployment
    and shared by every request to it. Subclasses are registered by name in
    :data:`gateway.providers.registry.PROVIDERS`."""

    def __init__(self, name: str, deployment: Deployment, transport: Transport | None = None) -> None:
        self.name = name
        self.deployment = deployment
        self.upstream_model = deployment.model or name
        self.transport = (
            transport if transport is not None else http_transport(deployment.base_url, deployment)
        )

    @classmethod
    def create(cls, name: str, deployment: Deployment) -> Provider:
        """The provider for ``deployment`` (the pool calls this; a subclass may pick a variant)."""
        return cls(name, deployment)

    @property
    def ready(self) -> bool:
        """Whether requests can be sent now (a launched vLLM still loading its model cannot)."""
        return self.transport.ready

    def shown_model(self, requested_model: str | None) -> str | None:
        """The ``model`` the client sees (``response_model``), or ``None`` to leave the provider's."""
        shown = self.deployment.response_model
        if shown == "deployment":
            return self.name
        if shown == "requested":
            return requested_model
        return None

    @abstractmethod
    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        """The OpenAI-format ``body`` rewritten for this provider (model name, cache hints,
        stream usage). Must not change ``body`` itself: hedged attempts share it."""

    @abstractmethod
    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> Scanner:
        """A fresh scanner for one streamed answer."""

    @abstractmethod
    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        """A whole 200 answer to ``endpoint`` (``/chat/completions`` ...): its usage, and the
        body with the ``model`` rewrite applied. Raises the failure
        (:func:`gateway.dispatch.failures.failure`) of a body that is no answer: empty,
        not the endpoint's JSON, or an error object."""

    def status_failure(self, status: int) -> str:
        """The :mod:`gateway.dispatch.failures` row of an error status this provider answered."""
        return http_failure(status)

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        """POST a prepared ``body`` to ``endpoint``; return at headers."""
        return await self.transport.send(endpoint, body, headers=headers, connect_timeout_s=connect_timeout_s)

    async def close(self) -> None:
        """Close the transport's pooled connections."""
        await self.transport.close()

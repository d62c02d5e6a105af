"""The HTTP call itself: a :class:`Transport` sends one JSON body and returns at headers.

A provider adapter owns a transport, made by :func:`gateway.providers.clients.http_transport`:
the lean HTTP/1.1 client of :mod:`gateway.providers.http1` by default, or :class:`HttpTransport`
here (aiohttp's client) when ``SWITCHYARD_UPSTREAM_CLIENT=aiohttp``. Tests give an adapter a
:class:`~gateway.providers.mock.MockTransport` instead, so everything above the socket
(attempts, retries, hedging, circuits) runs without a network.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

if TYPE_CHECKING:
    from gateway.policy import Deployment


class TransportResponse(ABC):
    """An answer whose headers arrived; the body is read or iterated, then closed."""

    status: int
    headers: Mapping[str, str]

    @abstractmethod
    async def read(self) -> bytes:
        """The whole body."""

    @abstractmethod
    def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, without waiting to fill a buffer."""

    def complete(self) -> bool:
        """Whether the whole body has arrived and been read (nothing left to wait for);
        ``False`` when unknown."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Drop the connection (an unfinished answer is never returned to the pool)."""

    @abstractmethod
    def release(self) -> None:
        """Return a fully read connection to the pool."""

    def release_at_end(self, within_s: float) -> bool:
        """The answer is complete but its body has not ended: drop the bytes still to come,
        return the connection to the pool when the end arrives within ``within_s``, else
        close it, all without a reader. ``False`` when this response cannot (the caller
        then reads the body to its end itself)."""
        return False


class Transport(ABC):
    """Sends requests to one base URL. Raises ``aiohttp.ClientError`` subclasses on
    connection failures (``ClientConnectorError`` when nothing was sent)."""

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
    ) -> TransportResponse:
        """POST ``body`` as JSON to ``endpoint`` (``/chat/completions`` ...); return at headers."""

    @abstractmethod
    async def close(self) -> None:
        """Close pooled connections."""


class _Response(TransportResponse):
    __slots__ = ("_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    async def read(self) -> bytes:
        return await self._resp.read()

    def iter_chunks(self) -> AsyncIterator[bytes]:
        # aiohttp's own iterator, not an async generator around it: one layer less per
        # chunk, and one left unfinished is not handed to the loop to be closed.
        return self._resp.content.iter_any()

    def complete(self) -> bool:
        return self._resp.content.at_eof()

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


def static_headers(deployment: Deployment) -> dict[str, str]:
    """The headers every request to ``deployment`` carries: JSON, its own ``headers``, and
    the key its ``api_key_env`` names (read once, only ever sent as ``Authorization``)."""
    headers = {"Content-Type": "application/json", **deployment.headers}
    key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


class HttpTransport(Transport):
    """One pooled, keep-alive aiohttp ``ClientSession`` per deployment (or replica)."""

    def __init__(self, base_url: str, deployment: Deployment) -> None:
        self._base_url = base_url
        self._max_connections = deployment.max_connections
        self._headers = static_headers(deployment)
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}

    def _get_session(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop, not to whoever built the pool.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=self._max_connections,
                keepalive_timeout=60,
                ttl_dns_cache=300,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                # Timeouts are applied per attempt by dispatch; none here.
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent",),
                raise_for_status=False,
            )
        return self._session

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        timeout = self._timeouts.get(connect_timeout_s)
        if timeout is None:
            timeout = self._timeouts[connect_timeout_s] = aiohttp.ClientTimeout(
                total=None, sock_connect=connect_timeout_s
            )
        resp = await self._get_session().post(
            self._base_url + endpoint,
            data=orjson.dumps(body),
            headers=headers,
            timeout=timeout,
            # Never follow an upstream's redirect: it would re-send the prompt and the key
            # wherever the upstream points. A 3xx is a failure (``upstream_redirect``).
            allow_redirects=False,
        )
        return _Response(resp)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

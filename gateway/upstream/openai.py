"""Client for OpenAI-compatible upstreams (OpenAI, vLLM, the simulator, most hosted providers)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from gateway.policy import Deployment
from gateway.upstream.base import Upstream, UpstreamResponse


class _Response(UpstreamResponse):
    __slots__ = ("_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    async def read(self) -> bytes:
        return await self._resp.read()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._resp.content.iter_any():
            yield chunk

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class OpenAICompatible(Upstream):
    """One pooled, keep-alive ``ClientSession`` per deployment.

    The API key is read once from the environment variable the policy names and is
    only ever put in the ``Authorization`` header.
    """

    def __init__(self, name: str, deployment: Deployment) -> None:
        super().__init__(name, deployment)
        self._base_url = deployment.base_url
        headers = {"Content-Type": "application/json", **deployment.headers}
        key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}

    def _get_session(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop, not to whoever built the pool.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.deployment.max_connections,
                limit_per_host=self.deployment.max_connections,
                keepalive_timeout=60,
                ttl_dns_cache=300,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
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
    ) -> UpstreamResponse:
        payload = orjson.dumps(dict(body, model=self.upstream_model))
        timeout = self._timeouts.get(connect_timeout_s)
        if timeout is None:
            timeout = self._timeouts[connect_timeout_s] = aiohttp.ClientTimeout(
                total=None, sock_connect=connect_timeout_s
            )
        resp = await self._get_session().post(
            self._base_url + endpoint, data=payload, headers=headers, timeout=timeout
        )
        return _Response(resp)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

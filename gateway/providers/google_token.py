"""OAuth access tokens from Google's metadata server, for ``provider: vertex`` with
``google_auth: metadata``.

On GKE (Workload Identity), Compute Engine and Cloud Run the workload's service account
hands out tokens at ``http://metadata.google.internal/computeMetadata/v1/instance/
service-accounts/default/token`` (header ``Metadata-Flavor: Google``; answer
``{"access_token", "expires_in", "token_type"}``). A token lives about an hour; this keeps
the current one and fetches the next when less than :data:`REFRESH_MARGIN_S` of it is left,
one fetch for every request that needs it meanwhile. ``GCE_METADATA_HOST`` (``host[:port]``)
names another server, as Google's own libraries read it. No Google library is needed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import aiohttp

from gateway.dispatch.failures import failure

METADATA_HOST_ENV = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
REFRESH_MARGIN_S = 300.0
"""A token with less than this left is replaced before it is used (5 minutes)."""
FETCH_TIMEOUT_S = 5.0


class MetadataToken:
    """The current access token of the workload's service account (see the module docstring)."""

    def __init__(self, deployment_name: str, *, now: Callable[[], float] = time.monotonic) -> None:
        host = os.environ.get(METADATA_HOST_ENV, "").strip() or DEFAULT_METADATA_HOST
        self.url = f"http://{host}{TOKEN_PATH}"
        self._name = deployment_name
        self._now = now
        self._token = ""
        self._expires_at = 0.0
        self._fetching: asyncio.Future[str] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.fetches = 0

    async def bearer(self) -> str:
        """A token valid for at least :data:`REFRESH_MARGIN_S` more (fetched if needed)."""
        if self._token and self._now() < self._expires_at - REFRESH_MARGIN_S:
            return self._token
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._fetch())
            self._fetching.add_done_callback(self._fetched)
        return await asyncio.shield(self._fetching)

    def _fetched(self, future: asyncio.Future[str]) -> None:
        self._fetching = None
        if not future.cancelled():
            future.exception()  # read, so a failed fetch nobody awaits is not logged as lost

    async def _fetch(self) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        self.fetches += 1
        try:
            async with self._session.get(self.url, headers={"Metadata-Flavor": "Google"}) as resp:
                data = await resp.json(content_type=None) if resp.status == 200 else None
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise self._failed(f"{type(exc).__name__}: {exc}") from None
        token = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise self._failed(f"HTTP {status}, no access_token")
        expires_in = data.get("expires_in") if isinstance(data, dict) else None
        lifetime = float(expires_in) if isinstance(expires_in, (int, float)) else 3600.0
        self._token, self._expires_at = token, self._now() + lifetime
        return token

    def _failed(self, why: str) -> Exception:
        return failure(
            "upstream_auth_failed",
            f"deployment '{self._name}' could not get an access token from the metadata server "
            f"({self.url}): {why}",
        )

    async def close(self) -> None:
        """Close the connection to the metadata server."""
        if self._session is not None:
            await self._session.close()
            self._session = None

"""Provider clients, pooled per deployment and kept across policy reloads."""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING

from gateway.providers.base import Provider
from gateway.providers.registry import PROVIDERS

if TYPE_CHECKING:
    from gateway.policy import Policy


def provider_class(name: str) -> type[Provider]:
    """The adapter class registered as provider ``name`` (imported on first use)."""
    module, _, attr = PROVIDERS[name].partition(":")
    found: type[Provider] = getattr(importlib.import_module(module), attr)
    return found


class UpstreamPool:
    """One client per deployment. A reload keeps the clients of unchanged deployments
    (and their warm connections); a changed or removed deployment's client is closed
    once the requests still using it have finished."""

    def __init__(self) -> None:
        self._clients: dict[str, Provider] = {}
        self.in_flight: dict[str, int] = {}
        self._retired: dict[Provider, int] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def update(self, policy: Policy) -> None:
        """Make the pool match ``policy``'s deployments."""
        fresh: dict[str, Provider] = {}
        for name, deployment in policy.deployments.items():
            old = self._clients.get(name)
            if old is not None and old.deployment == deployment:
                fresh[name] = old
            else:
                fresh[name] = provider_class(deployment.provider).create(name, deployment)
                self.in_flight.setdefault(name, 0)
        for name, old in self._clients.items():
            if fresh.get(name) is not old:
                self._retire(old)
        self._clients = fresh

    def get(self, name: str) -> Provider:
        """The provider of deployment ``name`` (``KeyError`` when the policy has none)."""
        return self._clients[name]

    def acquire(self, name: str) -> Provider:
        """The client for ``name``, counted as in use until :meth:`release`."""
        client = self._clients[name]
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        return client

    def release(self, client: Provider) -> None:
        """``client`` is no longer used by the request that acquired it."""
        self.in_flight[client.name] = max(0, self.in_flight.get(client.name, 0) - 1)
        if client in self._retired:
            self._retired[client] -= 1
            if self._retired[client] <= 0:
                del self._retired[client]
                self._close_later(client)

    def _retire(self, client: Provider) -> None:
        users = self.in_flight.get(client.name, 0) if self._clients.get(client.name) is client else 0
        if users > 0:
            self._retired[client] = users
        else:
            self._close_later(client)

    def _close_later(self, client: Provider) -> None:
        try:
            task = asyncio.get_running_loop().create_task(client.close())
        except RuntimeError:  # no loop: nothing was ever opened on it
            return
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every client, retired ones included."""
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

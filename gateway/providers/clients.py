"""Which HTTP client carries a deployment's requests: the lean HTTP/1.1 one by default."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import structlog

from gateway.providers.http1 import Http1Transport
from gateway.providers.transport import HttpTransport, Transport

if TYPE_CHECKING:
    from gateway.policy import Deployment

_log = structlog.get_logger("switchyard")

CLIENT_ENV = "SWITCHYARD_UPSTREAM_CLIENT"
"""``http1`` (the default): :class:`~gateway.providers.http1.Http1Transport`; ``aiohttp``:
:class:`~gateway.providers.transport.HttpTransport`, aiohttp's client, kept as an escape
hatch should an upstream need something only aiohttp does."""


def http_transport(base_url: str, deployment: Deployment) -> Transport:
    """The transport for one base URL (a deployment's, or one replica's), per :data:`CLIENT_ENV`.

    An unknown value is logged and the default used: a mistyped escape hatch must not stop
    a gateway that works without it."""
    choice = os.environ.get(CLIENT_ENV, "").strip().lower() or "http1"
    if choice == "aiohttp":
        return HttpTransport(base_url, deployment)
    if choice != "http1":
        _log.warning("unknown_upstream_client", variable=CLIENT_ENV, value=choice, using="http1")
    return Http1Transport(base_url, deployment)

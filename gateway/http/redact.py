"""What a client must not see kept out of what it sees: secrets in error messages that
quote an upstream, the detail of an upstream failure (exception text, the upstream's answer,
deployment names), and secrets in the policy as ``/admin/policy`` shows it."""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from gateway.config import PolicySnapshot
from gateway.context import RequestContext
from gateway.dispatch.failures import client_message
from gateway.errors import SwitchyardError
from gateway.http.state import SECRETS, SETTINGS


def _secrets(app: web.Application, snapshot: PolicySnapshot) -> tuple[str, ...]:
    """The secret values this gateway holds: the admin key, every upstream key its policy
    names, every header value it sends upstream (longer than 5 characters)."""
    cache = app[SECRETS]
    found = cache.get(snapshot.version)
    if found is None:
        values = {app[SETTINGS].admin_key or ""}
        for deployment in snapshot.policy.deployments.values():
            if deployment.api_key_env:
                values.add(os.environ.get(deployment.api_key_env, ""))
            values.update(deployment.headers.values())
        found = tuple(v for v in values if len(v) > 5)
        cache.clear()
        cache[snapshot.version] = found
    return found


def scrub(app: web.Application, snapshot: PolicySnapshot, text: str) -> str:
    """``text`` with any secret the gateway holds replaced: an error message that quotes an
    upstream's answer must never hand a client our keys."""
    for secret in _secrets(app, snapshot):
        if secret in text:
            text = text.replace(secret, "<redacted>")
    return text


def for_client(app: web.Application, ctx: RequestContext, exc: SwitchyardError) -> SwitchyardError:
    """``exc`` made fit for the client, in place: an upstream failure's message becomes its
    row's plain message (naming the deployment only for callers the policy's
    ``errors.expose_deployments`` trusts), its detail goes to ``ctx.error_detail`` for the log
    line and the trace; any secret the gateway holds is replaced in both."""
    ctx.error_code = exc.code
    plain = client_message(exc)
    if plain is not None:
        ctx.error_detail = scrub(app, ctx.snapshot, exc.message)
        key_name = ctx.key.name if ctx.key is not None else None
        if ctx.deployment is not None and ctx.snapshot.policy.errors.shows_deployment(key_name):
            plain = f"{plain} Deployment: '{ctx.deployment}'."
        exc.message = plain
    else:
        exc.message = scrub(app, ctx.snapshot, exc.message)
    return exc


def redacted_policy(snapshot: PolicySnapshot) -> dict[str, Any]:
    """The policy as ``/admin/policy`` shows it: header values (which may hold keys
    interpolated from the environment) and credentials in URLs replaced."""
    dumped: dict[str, Any] = snapshot.policy.model_dump(mode="json")
    for deployment in dumped["deployments"].values():
        deployment["headers"] = dict.fromkeys(deployment.get("headers") or {}, "<redacted>")
        url = deployment.get("base_url")
        if isinstance(url, str) and "@" in url.split("/", 3)[2]:
            scheme, rest = url.split("://", 1)
            deployment["base_url"] = f"{scheme}://<redacted>@{rest.split('@', 1)[1]}"
    return dumped

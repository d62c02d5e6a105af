"""Access tokens from the GCP metadata server: one fetch for concurrent callers, reuse until
five minutes before expiry (on a fake clock), a clear failure when there is no token."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from gateway.errors import UpstreamError
from gateway.providers.google_token import MetadataToken
from tests.helpers import free_port


async def _server(answers: list[Any], seen: list[str]) -> tuple[web.AppRunner, int]:
    async def token(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Metadata-Flavor", ""))
        await asyncio.sleep(0.05)  # long enough for concurrent callers to pile up
        answer = answers.pop(0)
        return web.json_response(answer) if isinstance(answer, dict) else web.Response(status=answer)

    app = web.Application()
    app.router.add_get("/computeMetadata/v1/instance/service-accounts/default/token", token)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def test_one_fetch_serves_concurrent_callers_until_near_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]

    async def run() -> tuple[list[str], list[str], list[str]]:
        seen: list[str] = []
        answers: list[Any] = [
            {"access_token": "t1", "expires_in": 3600},
            {"access_token": "t2", "expires_in": 3600},
        ]
        runner, port = await _server(answers, seen)
        monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
        token = MetadataToken("vx", now=lambda: now[0])
        try:
            first = list(await asyncio.gather(*(token.bearer() for _ in range(5))))
            now[0] += 3600 - 301  # still more than five minutes left
            reused = [await token.bearer()]
            now[0] += 2  # now less
            refreshed = [await token.bearer(), await token.bearer()]
        finally:
            await token.close()
            await runner.cleanup()
        assert seen == ["Google", "Google"]
        return first, reused, refreshed

    first, reused, refreshed = asyncio.run(run())
    assert first == ["t1"] * 5 and reused == ["t1"] and refreshed == ["t2", "t2"]


def test_no_token_is_a_credential_failure_naming_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> UpstreamError:
        runner, port = await _server([404], [])
        monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
        token = MetadataToken("vx")
        try:
            with pytest.raises(UpstreamError) as failed:
                await token.bearer()
        finally:
            await token.close()
            await runner.cleanup()
        return failed.value

    error = asyncio.run(run())
    assert getattr(error, "failure", None) == "upstream_auth_failed"
    assert "metadata server" in error.message and "HTTP 404" in error.message

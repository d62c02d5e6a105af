"""An upstream's redirect is never followed and never an answer, with either upstream client:
it is the failure ``upstream_redirect`` (502), and the place it points to gets nothing."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.procutil import free_port

CHAT = {
    "id": "chatcmpl-redirected",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class _Upstream(http.server.BaseHTTPRequestHandler):
    """``/redirect/<status>/...`` answers that redirect (with a chat body, as a misbehaving
    upstream might) to ``/target/...`` on itself; ``/target/...`` counts the prompts it got."""

    target_hits: list[str] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = json.dumps(CHAT).encode()
        if self.path.startswith("/redirect/"):
            status = int(self.path.split("/")[2])
            self.send_response(status)
            port = self.server.server_address[1]
            self.send_header("Location", f"http://127.0.0.1:{port}/target/v1/chat/completions")
        else:
            _Upstream.target_hits.append(self.path)
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("client", ["http1", "aiohttp"])
@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_is_an_upstream_failure_and_is_not_followed(
    make_gateway: Any, upstream: str, client: str, status: int
) -> None:
    _Upstream.target_hits = []
    policy = f"""
deployments:
  moved: {{provider: openai, base_url: "{upstream}/redirect/{status}/v1", model: m}}
tiers: {{fast: [moved]}}
"""
    gw = make_gateway(policy, env={"SWITCHYARD_UPSTREAM_CLIENT": client})
    sdk = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as caught:
            if stream:
                for _ in sdk.chat.completions.create(
                    model="fast", messages=[{"role": "user", "content": "hi"}], stream=True
                ):
                    pass
            else:
                sdk.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 502
        body = caught.value.body
        assert isinstance(body, dict) and body.get("code") == "upstream_redirect", body
        assert "answered 200" not in str(body.get("message"))
    assert _Upstream.target_hits == [], "the gateway followed the redirect and re-sent the prompt"

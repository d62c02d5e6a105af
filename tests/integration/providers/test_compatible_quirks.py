"""The OpenAI-compatible presets through a gateway process, each against a fake upstream that
behaves as the provider's public API reference says:

- DeepSeek reports cache hits as ``usage.prompt_cache_hit_tokens`` / ``prompt_cache_miss_tokens``
  (its context-caching guide), on answers and on the stream's last chunk;
- Mistral's API validates strictly: ``stream_options`` is a 422 ``extra_forbidden``; it sends
  usage on the stream's last chunk anyway;
- Groq answers a 400 for ``logprobs``, ``logit_bias``, ``top_logprobs``, ``messages[].name``
  and ``n`` other than 1 (its OpenAI-compatibility page).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from tests.fixtures.threaded_app import ThreadedApp
from tests.helpers import GatewayProcess


class FakeCompatible(ThreadedApp):
    """DeepSeek at ``/deepseek/v1``, Mistral at ``/mistral/v1``, Groq at ``/groq/openai/v1``."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{provider}/v1/chat/completions", self._chat)
        app.router.add_post("/{provider}/openai/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        provider = request.match_info["provider"]
        body = orjson.loads(await request.read())
        self.requests.append((provider, body))
        if provider == "mistral" and "stream_options" in body:
            detail = [
                {
                    "type": "extra_forbidden",
                    "loc": ["body", "stream_options"],
                    "msg": "Extra inputs are not permitted",
                }
            ]
            error = {
                "object": "error",
                "message": {"detail": detail},
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
            return web.json_response(error, status=422)
        if provider == "groq":
            bad = [f for f in ("logprobs", "logit_bias", "top_logprobs") if f in body]
            if bad or body.get("n", 1) != 1 or any("name" in m for m in body["messages"]):
                error = {
                    "error": {
                        "message": f"'{(bad or ['n'])[0]}' : not supported",
                        "type": "invalid_request_error",
                    }
                }
                return web.json_response(error, status=400)
        usage: dict[str, Any] = {"prompt_tokens": 1200, "completion_tokens": 2, "total_tokens": 1202}
        if provider == "deepseek":
            usage |= {"prompt_cache_hit_tokens": 1088, "prompt_cache_miss_tokens": 112}
        base = {"id": "c1", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            answer = {
                **base,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}
        first = {
            **chunk,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}],
        }
        # DeepSeek and Mistral put usage on the last chunk, with its finish_reason.
        last = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        for item in (first, last):
            await resp.write(b"data: " + orjson.dumps(item) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeCompatible]:
    with FakeCompatible() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    fake: FakeCompatible, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    policy = f"""
deployments:
  ds: {{provider: deepseek, base_url: "{fake.url}/deepseek/v1", model: deepseek-chat, api_key_env: DS_KEY}}
  mi: {{provider: mistral, base_url: "{fake.url}/mistral/v1", model: mistral-small-latest}}
  gq: {{provider: groq, base_url: "{fake.url}/groq/openai/v1", model: llama-3.3-70b-versatile}}
tiers: {{fast: [ds], strong: [mi]}}
"""
    gw = GatewayProcess(
        policy, redis_url=redis_url, workdir=tmp_path_factory.mktemp("compat-gw"), env={"DS_KEY": "k"}
    )
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=15) as c:
        yield c


def test_deepseek_cache_hits_are_cached_tokens_for_the_client_and_the_accounting(
    client: openai.OpenAI, gateway: GatewayProcess
) -> None:
    reply = client.chat.completions.create(model="ds", messages=[{"role": "user", "content": "cached?"}])
    assert reply.usage and reply.usage.prompt_tokens_details
    assert reply.usage.prompt_tokens_details.cached_tokens == 1088
    gateway.wait_log(lambda line: line.get("deployment") == "ds" and line.get("cached_tokens") == 1088)
    chunks = list(
        client.chat.completions.create(
            model="ds", messages=[{"role": "user", "content": "streamed"}], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    # The stream's usage chunk (DeepSeek's fields) is accounted the same way.
    gateway.wait_log(
        lambda line: (
            line.get("deployment") == "ds"
            and line.get("stream") is True
            and line.get("cached_tokens") == 1088
        )
    )


def test_mistral_streams_without_stream_options_and_keeps_its_usage(
    client: openai.OpenAI, fake: FakeCompatible
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="mi",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    sent = [body for provider, body in fake.requests if provider == "mistral"][-1]
    assert "stream_options" not in sent
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 1200


def test_groq_unsupported_param_is_a_400_from_the_gateway(
    client: openai.OpenAI, fake: FakeCompatible
) -> None:
    before = len(fake.requests)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gq", messages=[{"role": "user", "content": "hi"}], logprobs=True
        )
    assert caught.value.param == "logprobs" and "does not support 'logprobs'" in caught.value.message
    assert len(fake.requests) == before
    reply = client.chat.completions.create(
        model="gq", messages=[{"role": "user", "name": "ann", "content": "hi"}], n=1
    )
    assert reply.choices[0].message.content == "ok"

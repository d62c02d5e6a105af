"""The semantic cache: a paraphrase of a stored last user turn (above the threshold, same
conversation before it, same tenant) is answered with the stored answer; anything else
goes upstream. Needs the ``[semantic]`` extra."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis

from gateway.cache.semantic import missing_extra
from tests.helpers import GatewayProcess, SimServer, sim_policy

pytestmark = pytest.mark.skipif(missing_extra() is not None, reason=str(missing_extra()))

POLICY_EXTRA = "cache: {enabled: true, semantic: {enabled: true, threshold: 0.9}}\n"
STORED = "How do I reverse a list in Python?"
PARAPHRASE = "How can I reverse a Python list?"  # 0.985 with the shipped static embeddings
NEIGHBOUR = "How do I sort a list in Python?"  # 0.754: close in words, another question


@pytest.fixture(scope="module")
def gateway(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("semantic")
    gw = GatewayProcess(sim_policy(sim.base_url, POLICY_EXTRA), redis_url=redis_url, workdir=workdir)
    gw.start()
    yield gw
    gw.stop()


def ask(gw: GatewayProcess, system: str, text: str, **kw: Any) -> tuple[str, str, str]:
    """``(x-switchyard-cache, x-switchyard-cache-entry, the answer's text)``."""
    client = openai.OpenAI(base_url=gw.base_url, api_key="none", max_retries=0, timeout=15)
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": text}],
        temperature=0,
        **kw,
    )  # type: ignore[call-overload]
    if kw.get("stream"):
        content = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        content = raw.parse().choices[0].message.content or ""
    return raw.headers.get("x-switchyard-cache", ""), raw.headers.get("x-switchyard-cache-entry", ""), content


def stored(gw: GatewayProcess, redis_url: str, system: str, text: str) -> tuple[str, str]:
    """Ask once and wait until the answer and its vector are stored: (the answer, its entry id)."""
    header, _, answer = ask(gw, system, text)
    assert header == "store"
    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 5
    while True:
        vectors = [k for k in r.scan_iter(match="sy:rcv:*") if not k.endswith(b":ver")]
        fields = [f.decode() for k in vectors for f in r.hkeys(k)]
        header, entry, _ = ask(gw, system, text)
        if header == "hit" and entry in fields:
            return answer, entry
        assert time.monotonic() < deadline, (header, fields)
        time.sleep(0.05)


def test_a_paraphrase_gets_the_stored_answer_with_its_similarity_and_id(
    gateway: GatewayProcess, sim: SimServer, redis_url: str
) -> None:
    system = f"You answer programming questions. ({uuid.uuid4().hex})"
    answer, entry = stored(gateway, redis_url, system, STORED)
    calls = sim.stats()["requests_total"]
    header, served, content = ask(gateway, system, PARAPHRASE)
    assert header.startswith("hit; semantic; sim=") and float(header.rpartition("=")[2]) >= 0.9
    assert served == entry and content == answer
    line = gateway.wait_log(lambda x: x.get("event") == "request" and x.get("cache_similarity") is not None)
    assert line["cache"] == "hit" and line["cache_entry"] == entry and line["cache_similarity"] >= 0.9
    header, served, content = ask(gateway, system, PARAPHRASE, stream=True)
    assert header.startswith("hit; semantic") and content == answer
    assert sim.stats()["requests_total"] == calls


def test_below_the_threshold_or_in_another_conversation_goes_upstream(
    gateway: GatewayProcess, sim: SimServer, redis_url: str
) -> None:
    system = f"You answer programming questions. ({uuid.uuid4().hex})"
    stored(gateway, redis_url, system, STORED)
    calls = sim.stats()["requests_total"]
    # Close in words, another question: under the threshold.
    assert ask(gateway, system, NEIGHBOUR)[0] == "store"
    # The same paraphrase after another system prompt: another context, never compared.
    assert ask(gateway, system + " Be brief.", PARAPHRASE)[0] == "store"
    assert sim.stats()["requests_total"] == calls + 2


def test_another_gateway_on_the_same_redis_serves_the_stored_vectors(
    gateway: GatewayProcess, sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    system = f"You answer programming questions. ({uuid.uuid4().hex})"
    answer, entry = stored(gateway, redis_url, system, STORED)
    workdir = tmp_path_factory.mktemp("semantic-2")
    other = GatewayProcess(
        sim_policy(sim.base_url, POLICY_EXTRA), redis_url=redis_url, workdir=workdir, flush_redis=False
    ).start()
    try:
        header, served, content = ask(other, system, PARAPHRASE)
    finally:
        other.stop()
    assert header.startswith("hit; semantic") and served == entry and content == answer

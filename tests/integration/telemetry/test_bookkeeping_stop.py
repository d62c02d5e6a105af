"""The finished requests' bookkeeping runs in batches; a stop right after the last answer
still writes every request's log line and every request's counters to Redis."""

from __future__ import annotations

import json
from typing import Any

import openai
import redis

from tests.helpers import SimServer, sim_policy

REQUESTS = 12


def test_a_sigterm_right_after_the_last_answer_loses_no_log_line_and_no_count(
    make_gateway: Any, sim: SimServer, redis_url: str
) -> None:
    sim.reset()
    gw = make_gateway(sim_policy(sim.base_url))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    ids = set()
    for _ in range(REQUESTS):
        raw = client.chat.completions.with_raw_response.create(
            model="fast", messages=[{"role": "user", "content": "hi"}]
        )
        ids.add(raw.headers["x-request-id"])
    assert gw.stop() == 0  # at once: the last records are still in the buffer
    lines = [json.loads(line) for line in gw.log_path.read_text().splitlines() if line.startswith("{")]
    logged = {line["request_id"] for line in lines if line.get("event") == "request"}
    assert logged == ids
    store = redis.Redis.from_url(redis_url)
    counted = 0
    for key in store.scan_iter("sy:dash:*"):
        for field, value in store.hgetall(key).items():
            if field.decode().endswith("|requests"):
                counted += int(value)
    assert counted == REQUESTS

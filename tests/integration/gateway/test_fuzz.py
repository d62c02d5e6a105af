"""Hypothesis over request bodies and headers against a running gateway: never a 500, never a crash."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import GatewayProcess, SimServer, sim_policy
from tests.integration.gateway.test_keys import ADMIN_KEY

ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/fanout"]
# SWITCHYARD_FUZZ_EXAMPLES=5000 for a longer, randomised hunt; CI runs a fixed 250 per test.
_EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES", "250"))
FUZZ = settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize="SWITCHYARD_FUZZ_EXAMPLES" not in os.environ,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
any_of = st.one_of(json_values, scalars)
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "x"]) | any_of},
    optional={"text": any_of, "image_url": any_of},
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | any_of,
        "content": st.text(max_size=50) | st.lists(part, max_size=3) | any_of,
        "name": any_of,
        "tool_calls": any_of,
        "tool_call_id": any_of,
    },
)
chat_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["fast", "strong", "auto", "sim-fast", "nope"]) | any_of,
        "messages": st.lists(message, max_size=4) | any_of,
        "stream": st.booleans() | any_of,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": any_of}) | any_of,
        "max_tokens": st.integers(min_value=-5, max_value=64) | any_of,
        "temperature": any_of,
        "n": st.integers(min_value=-1, max_value=3) | any_of,
        "tools": any_of,
        "tool_choice": any_of,
        "response_format": any_of,
        "metadata": st.dictionaries(
            st.sampled_from(["switchyard_tier", "switchyard_template", "x"]), any_of, max_size=2
        )
        | any_of,
        "prompt": any_of,
        "input": any_of,
        "requests": st.lists(st.builds(dict) | any_of, max_size=2) | any_of,
    },
)
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
headers = st.fixed_dictionaries(
    {},
    optional={
        "x-request-id": header_text,
        "x-switchyard-tier": header_text | st.sampled_from(["fast", "strong"]),
        "x-switchyard-timeout": header_text | st.sampled_from(["1s", "0", "-1", "150ms", "1e309"]),
        "x-switchyard-template": header_text,
        "Authorization": header_text | st.just("Bearer ") | st.just("Bearer sk-sy-0123456789ab_x"),
        "Content-Type": header_text | st.just("application/json"),
        "Content-Encoding": st.sampled_from(["gzip", "br", "identity"]),
    },
)


@pytest.fixture(scope="module")
def gateways(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    """One open gateway and one that wants virtual keys."""
    work = tmp_path_factory.mktemp("fuzz")
    policy = sim_policy(sim.base_url)
    started = [
        GatewayProcess(policy, redis_url=redis_url, workdir=work).start(),
        GatewayProcess(
            policy,
            redis_url=redis_url,
            workdir=work,
            env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY},
            flush_redis=False,
        ).start(),
    ]
    yield started
    # Every gateway is stopped before any is checked: a failed check leaves none running.
    alive = [gw.proc is not None and gw.proc.poll() is None for gw in started]
    for gw in started:
        gw.stop()
    assert all(alive), "a gateway died under fuzzing"
    for gw in started:
        assert_no_unhandled_error(gw.log_path.read_text())


def assert_no_unhandled_error(log: str) -> None:
    """No request ended in an unhandled error and no traceback was written. Read by the
    log's fields: a fuzzed request id or model may itself be the text "unhandled_error"
    (Hypothesis draws strings from the code's own literals) and is logged as it came."""
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            assert record.get("event") != "unhandled_error" and "exception" not in record, line
        else:
            assert "unhandled_error" not in line and "Traceback" not in line, line


def send(gw: GatewayProcess, method: str, path: str, body: bytes, hdrs: dict[str, str]) -> None:
    """One request on a fresh connection; the answer must be an OpenAI error or a success."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert resp.status != 500, data
    assert resp.status < 500 or resp.status in (502, 503, 504), (resp.status, data)
    if resp.status >= 400 and method != "HEAD":
        error = json.loads(data)
        assert set(error) == {"error"} and isinstance(error["error"]["message"], str)


@FUZZ
@given(endpoint=st.sampled_from(ENDPOINTS), body=chat_body, hdrs=headers, keyed=st.booleans())
def test_structured_bodies_never_500(
    gateways: list[GatewayProcess], endpoint: str, body: dict[str, Any], hdrs: dict[str, str], keyed: bool
) -> None:
    send(gateways[1 if keyed else 0], "POST", endpoint, json.dumps(body).encode(), hdrs)


@FUZZ
@given(
    endpoint=st.sampled_from([*ENDPOINTS, "/v1/models", "/admin/keys", "/admin/stats", "/admin/costs"]),
    raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()),
    hdrs=headers,
    method=st.sampled_from(["POST", "GET", "DELETE", "PUT"]),
    query=st.sampled_from(["", "?since=-1", "?since=abc", "?days=0", "?days=99999", "?since=1e400"]),
)
def test_raw_bytes_and_methods_never_500(
    gateways: list[GatewayProcess], endpoint: str, raw: bytes, hdrs: dict[str, str], method: str, query: str
) -> None:
    send(gateways[0], method, endpoint + query, raw, hdrs)

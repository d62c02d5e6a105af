"""Every injected fault, observed the way a client sees it on the wire."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from local_backend.sim import SimControl, SimThread

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the harbor."}]


def wait_for(predicate: Callable[[], bool], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@dataclass
class Raw:
    status: int | None
    headers_s: float | None  # when the response headers arrived
    first_data_s: float | None  # when the first body bytes arrived
    total_s: float
    body: bytes
    error: BaseException | None

    @property
    def events(self) -> list[bytes]:
        return [e.removeprefix(b"data: ") for e in self.body.split(b"\n\n") if e]


def raw_chat(sim: SimThread, fault: str, timeout_s: float = 5.0, **body: Any) -> Raw:
    """POST a chat request with ``x-sim-fault`` and read whatever arrives, however it ends."""
    payload = {"model": "m", "messages": MESSAGES, "stream": True, **body}
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=timeout_s)
    t0 = time.perf_counter()
    status = headers_s = first_data_s = None
    out = b""
    error: BaseException | None = None
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(payload).encode(),
            {"Content-Type": "application/json", "x-sim-fault": fault},
        )
        resp = conn.getresponse()
        status, headers_s = resp.status, time.perf_counter() - t0
        while chunk := resp.read1(65536):
            first_data_s = first_data_s or time.perf_counter() - t0
            out += chunk
    except (http.client.HTTPException, OSError) as exc:
        error = exc
    finally:
        conn.close()
    return Raw(status, headers_s, first_data_s, time.perf_counter() - t0, out, error)


def test_error_faults_answer_that_status(client: openai.OpenAI, control: SimControl) -> None:
    with pytest.raises(openai.InternalServerError) as default:
        client.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "error"})
    assert default.value.status_code == 500
    with pytest.raises(openai.InternalServerError) as overloaded:
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "error=503"}
        )
    assert overloaded.value.status_code == 503
    assert isinstance(overloaded.value.body, dict) and overloaded.value.body["type"] == "server_error"
    with pytest.raises(openai.APIStatusError) as teapot:
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "error=418"}
        )
    assert teapot.value.status_code == 418
    stats = control.stats()
    assert stats["faults"] == {"error": 3}
    assert [(r["status"], r["outcome"]) for r in stats["recent"]] == [
        (500, "error"),
        (503, "error"),
        (418, "error"),
    ]


def test_rate_limit_is_429_with_retry_after(client: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "rate_limit=2"}
        )
    headers = info.value.response.headers
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert info.value.code == "rate_limit_exceeded" and info.value.type == "requests"


def test_context_length_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "context_length"}
        )
    assert info.value.code == "context_length_exceeded" and info.value.param == "messages"


def test_hang_sends_nothing_until_the_client_leaves(sim: SimThread, control: SimControl) -> None:
    quick = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        quick.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "hang"})
    raw = raw_chat(sim, "hang", timeout_s=0.3)
    assert raw.status is None and isinstance(raw.error, TimeoutError)  # not even headers
    wait_for(lambda: control.stats()["cancelled"] == 2)
    stats = control.stats()
    assert stats["in_flight"] == 0 and stats["faults"] == {"hang": 2}
    assert [r["outcome"] for r in stats["recent"]] == ["cancelled", "cancelled"]


def test_slow_first_token_delays_the_first_event_not_the_headers(
    sim: SimThread, client: openai.OpenAI
) -> None:
    raw = raw_chat(sim, "slow_first_token=300")
    assert raw.status == 200 and raw.headers_s is not None and raw.first_data_s is not None
    assert raw.headers_s < 0.2 and raw.first_data_s >= 0.3
    assert raw.events[-1] == b"[DONE]"
    t0 = time.perf_counter()
    client.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "slow_first_token=300"}
    )
    assert time.perf_counter() - t0 >= 0.3


def test_reset_mid_stream_cuts_the_connection(
    sim: SimThread, client: openai.OpenAI, control: SimControl
) -> None:
    raw = raw_chat(sim, "reset_mid_stream=3")
    assert raw.status == 200 and isinstance(raw.error, http.client.IncompleteRead)
    assert len(raw.events) == 4 and b"[DONE]" not in raw.body  # the role chunk, then three content chunks
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "reset_mid_stream=3"}
    )
    received = []
    with pytest.raises(openai.APIConnectionError):
        received.extend(chunk.choices[0].delta.content for chunk in stream)
    assert len(received) == 4
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-sim-fault": "reset_mid_stream"}
        )
    stats = control.stats()
    assert (stats["aborted"], stats["completed"], stats["faults"]) == (3, 0, {"reset_mid_stream": 3})
    assert {r["outcome"] for r in stats["recent"]} == {"reset_mid_stream"}


def test_stall_mid_stream_forever_and_for_a_while(sim: SimThread, control: SimControl) -> None:
    plain = raw_chat(sim, "")
    stalled = raw_chat(sim, "stall_mid_stream=2", timeout_s=0.4)
    assert isinstance(stalled.error, TimeoutError) and len(stalled.events) == 3  # role + 2, then silence
    wait_for(lambda: control.stats()["cancelled"] == 1)
    paused = raw_chat(sim, "stall_mid_stream=2:300")
    assert paused.error is None and paused.total_s >= 0.3

    def contents(raw: Raw) -> list[str | None]:
        return [json.loads(e)["choices"][0]["delta"].get("content") for e in raw.events[:-1]]

    assert contents(paused) == contents(plain)  # the whole answer, only later
    assert paused.events[-1] == b"[DONE]"


def test_malformed_chunk_then_the_stream_goes_on(sim: SimThread, client: openai.OpenAI) -> None:
    raw = raw_chat(sim, "malformed_chunk=2")
    assert raw.events[3] == b"{not json" and raw.events[-1] == b"[DONE]"
    assert all(json.loads(e) for e in raw.events[:3] + raw.events[4:-1])
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "malformed_chunk=2"}
    )
    with pytest.raises(ValueError):
        list(stream)
    request = urllib.request.Request(
        sim.base_url + "/chat/completions",
        data=json.dumps({"model": "m", "messages": MESSAGES}).encode(),
        headers={"Content-Type": "application/json", "x-sim-fault": "malformed_chunk"},
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert (resp.status, resp.read()) == (200, b"{not json")


def test_content_faults(client: openai.OpenAI) -> None:
    def ask(fault: str, **kwargs: Any) -> Any:
        return client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-sim-fault": fault}, **kwargs
        )

    empty = ask("empty")
    assert empty.choices[0].message.content == "" and empty.choices[0].finish_reason == "stop"
    assert empty.usage.completion_tokens == 0
    streamed = list(ask("empty", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == ""
    assert streamed[-1].choices[0].finish_reason == "stop"
    bad = ask("bad_json", response_format={"type": "json_object"})
    assert bad.choices[0].message.content.startswith('{"answer": "')
    with pytest.raises(ValueError):
        json.loads(bad.choices[0].message.content)
    cut = ask("length")
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3
    assert ask("length=5").usage.completion_tokens == 5
    both = ask("slow_first_token=100, length=2", stream=True)
    t0 = time.perf_counter()
    chunks = list(both)
    assert time.perf_counter() - t0 >= 0.09 and chunks[-1].choices[0].finish_reason == "length"


def test_a_bad_fault_header_is_a_400(sim: SimThread) -> None:
    raw = raw_chat(sim, "explode=1")
    assert raw.status == 400
    assert json.loads(raw.body)["error"]["param"] == "x-sim-fault"


def test_client_leaving_mid_stream_is_counted_cancelled(client: openai.OpenAI, control: SimControl) -> None:
    stream = client.chat.completions.create(model="timed", messages=MESSAGES, stream=True)
    next(iter(stream))
    stream.close()
    wait_for(lambda: control.stats()["cancelled"] == 1)
    assert control.stats()["in_flight"] == 0 and control.stats()["recent"][-1]["outcome"] == "cancelled"


def test_model_rules_with_count_and_model(client: openai.OpenAI, control: SimControl) -> None:
    assert control.add_fault("m", "error=500", count=2) == [
        {"model": "m", "fault": "error=500", "rate": 1.0, "count": 2}
    ]
    results = []
    for _ in range(3):
        try:
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)
            results.append("ok")
        except openai.InternalServerError:
            results.append("500")
    assert results == ["500", "500", "ok"]
    assert control.faults() == []  # spent
    control.add_fault("timed", "context_length")
    client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)  # another model: untouched
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="timed", messages=MESSAGES, max_tokens=1)
    control.clear_faults()
    client.chat.completions.create(model="timed", messages=MESSAGES, max_tokens=1)
    assert control.stats()["faults"] == {"error": 2, "context_length": 1}


def test_model_rule_rate_and_every_model(client: openai.OpenAI, control: SimControl) -> None:
    control.add_fault("*", "length=1", rate=0.5)
    finishes = [
        client.chat.completions.create(model="m", messages=MESSAGES).choices[0].finish_reason
        for _ in range(40)
    ]
    cut = finishes.count("length")
    assert 8 <= cut <= 32 and cut == control.stats()["faults"]["length"]


def test_bad_rules_are_refused(control: SimControl) -> None:
    for rule in ({"model": "m", "fault": "nope"}, {"model": "m", "fault": "error", "rate": 3}, {"fault": 5}):
        with pytest.raises(urllib.error.HTTPError) as info:
            control._call("POST", "/sim/faults", rule)
        assert info.value.code == 400
    assert control.faults() == []


def test_embeddings_honour_rejecting_faults_only(client: openai.OpenAI, control: SimControl) -> None:
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model="m", input="x", extra_headers={"x-sim-fault": "rate_limit"})
    reply = client.embeddings.create(
        model="m", input="x", extra_headers={"x-sim-fault": "reset_mid_stream=1"}
    )
    assert len(reply.data) == 1
    assert control.stats()["faults"] == {"rate_limit": 1}

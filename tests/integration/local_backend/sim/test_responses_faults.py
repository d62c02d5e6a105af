"""Mid-stream faults on the simulator's native ``/v1/responses`` stream: the fault reaches
the client as it would from a real upstream, and the simulator itself logs no traceback."""

from __future__ import annotations

import http.client
import json
import logging
import time

import pytest

from local_backend.sim import SimThread


def _settled(sim: SimThread) -> None:
    """Wait until the simulator has finished every request (it notices a hang-up late)."""
    deadline = time.monotonic() + 3
    while sim.control.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)


def _stream(sim: SimThread, fault: str, stop_at: bytes | None = None, model: str = "m") -> bytes:
    """POST a streamed Responses request with ``x-sim-fault``; read until the end, a cut, or
    the first ``stop_at`` (then hang up, as a gateway does on a malformed event)."""
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=5)
    body = json.dumps({"model": model, "input": "Tell me about the harbor.", "stream": True}).encode()
    conn.request("POST", "/v1/responses", body, {"Content-Type": "application/json", "x-sim-fault": fault})
    resp = conn.getresponse()
    out = b""
    try:
        while chunk := resp.read1(65536):
            out += chunk
            if stop_at is not None and stop_at in out:
                break
    except (http.client.IncompleteRead, ConnectionError):
        pass
    finally:
        conn.close()
    return out


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]


def test_reset_mid_stream_cuts_without_a_traceback(sim: SimThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    out = _stream(sim, "reset_mid_stream=2")
    assert b"response.created" in out and b"response.completed" not in out
    _settled(sim)
    assert _tracebacks(caplog) == []


def test_malformed_chunk_goes_out_once_then_the_stream_completes(
    sim: SimThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    whole = _stream(sim, "malformed_chunk=2")
    assert whole.count(b"{not json") == 1 and b"response.completed" in whole
    # "timed" writes its tokens 10 ms apart: the writes after the hang-up fail.
    _stream(sim, "malformed_chunk=1", stop_at=b"{not json", model="timed")
    _settled(sim)
    assert _tracebacks(caplog) == []

"""Clients that misbehave, over real sockets: a request sent a byte at a time (slowloris)
gets a deadline, and a body in an encoding the gateway cannot read is refused with 415."""

from __future__ import annotations

import gzip
import json
import socket
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import GatewayProcess, SimServer, sim_policy
from tests.integration.gateway.test_errors import assert_openai_error

HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
CHAT = json.dumps({"model": "fast", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(scope="module")
def gw(sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(
        sim_policy(sim.base_url),
        redis_url=redis_url,
        workdir=tmp_path_factory.mktemp("deadlines"),
        env={
            "SWITCHYARD_REQUEST_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "SWITCHYARD_REQUEST_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        },
    ).start()
    yield gateway
    gateway.stop()


def _connect(gw: GatewayProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gw.port), timeout=10)


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the gateway sends until it closes the connection, and when it closed."""
    t0 = time.monotonic()
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - t0


def _status_and_json(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_body_sent_too_slowly_is_408_in_openai_shape_and_the_connection_closes(gw: GatewayProcess) -> None:
    with _connect(gw) as sock:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(CHAT)}\r\n\r\n"
        )
        sock.sendall(head.encode() + CHAT[:10])  # ... and the rest never comes
        raw, closed_after_s = _read_until_closed(sock)
    status, body = _status_and_json(raw)
    assert status == 408 and assert_openai_error(body)["code"] == "request_timeout"
    assert BODY_TIMEOUT_S * 0.8 < closed_after_s < BODY_TIMEOUT_S + 2


def test_headers_sent_too_slowly_are_408_and_the_connection_closes(gw: GatewayProcess) -> None:
    with _connect(gw) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        # A byte every 0.1 s: each arrives in time, the headers as a whole do not.
        with pytest.raises(OSError):
            for byte in b"X-Slow: " + b"a" * 200:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
        raw, _ = _read_until_closed(sock)
        closed_after_s = time.monotonic() - t0
    status, body = _status_and_json(raw)
    assert status == 408 and assert_openai_error(body)["code"] == "request_timeout"
    assert closed_after_s < HEADER_TIMEOUT_S + 2


def test_a_connection_that_never_sends_a_request_is_closed(gw: GatewayProcess) -> None:
    with _connect(gw) as sock:
        raw, closed_after_s = _read_until_closed(sock)
    assert raw == b"" and closed_after_s < HEADER_TIMEOUT_S + 2


def test_an_idle_keep_alive_connection_is_not_cut_by_the_header_deadline(gw: GatewayProcess) -> None:
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(CHAT)}\r\n\r\n"
    ).encode() + CHAT
    with _connect(gw) as sock:
        for _ in range(2):
            sock.sendall(request)
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                reply += sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200")
            # Idle between requests for longer than the header deadline: keep-alive's
            # business, not a slow client.
            time.sleep(HEADER_TIMEOUT_S * 2)


def _post(gw: GatewayProcess, body: bytes, encoding: str) -> tuple[int, Any]:
    req = urllib.request.Request(
        gw.base_url + "/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("encoding", ["compress", "xz", "gzip, deflate", "exi"])
def test_an_unknown_content_encoding_is_415_naming_what_is_accepted(
    gw: GatewayProcess, encoding: str
) -> None:
    status, body = _post(gw, CHAT, encoding)
    error = assert_openai_error(body)
    assert status == 415 and error["code"] == "unsupported_content_encoding"
    assert "gzip" in error["message"] and "deflate" in error["message"]


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [("identity", bytes), ("gzip", gzip.compress), ("GZIP", gzip.compress), ("deflate", zlib.compress)],
)
def test_identity_gzip_and_deflate_bodies_are_read(gw: GatewayProcess, encoding: str, encode: Any) -> None:
    status, body = _post(gw, encode(CHAT), encoding)
    assert status == 200 and body["choices"], body


def test_a_body_that_does_not_match_its_encoding_is_400(gw: GatewayProcess) -> None:
    status, body = _post(gw, CHAT, "gzip")
    assert status == 400 and assert_openai_error(body)["code"] == "invalid_body"

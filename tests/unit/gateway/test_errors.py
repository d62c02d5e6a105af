import orjson
import pytest

from gateway.dispatch.backoff import retry_after_s
from gateway.dispatch.failures import status_error
from gateway.errors import (
    RateLimitError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)


def body(message: str, code: str | None = None, type_: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def test_client_errors_are_relayed_with_their_fields() -> None:
    err = status_error("d", 400, body("too long", "context_length_exceeded"), {})
    assert isinstance(err, UpstreamStatusError)
    assert err.status == 400
    assert err.to_dict()["error"] == {
        "message": "too long",
        "type": "invalid_request_error",
        "param": None,
        "code": "context_length_exceeded",
    }


def test_upstream_auth_failure_is_a_gateway_fault_not_the_clients() -> None:
    err = status_error("gpt", 401, body("bad key", "invalid_api_key"), {})
    assert isinstance(err, UpstreamError)
    assert err.status == 502
    assert err.code == "upstream_auth_failed"


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (500, UpstreamError, 502),
        (502, UpstreamError, 502),
        (503, UpstreamUnavailableError, 503),
        (504, UpstreamTimeoutError, 504),
    ],
)
def test_upstream_failures(status: int, kind: type, expected: int) -> None:
    err = status_error("d", status, b"oops", {})
    assert isinstance(err, kind)
    assert err.status == expected
    assert "oops" in err.message


def test_rate_limit_keeps_retry_after() -> None:
    err = status_error("d", 429, body("slow down", "rate_limit_exceeded", "requests"), {"Retry-After": "3"})
    assert isinstance(err, RateLimitError)
    assert err.headers["Retry-After"] == "3"
    assert err.retry_after_s == 3


def test_retry_after_forms() -> None:
    assert retry_after_s({"Retry-After": "2.5"}) == 2.5
    assert retry_after_s({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_s({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_s({}) is None
    assert retry_after_s({"Retry-After": "soon"}) is None


def test_retry_after_header_rounds_up() -> None:
    assert RateLimitError("x", retry_after_s=0.2).headers["Retry-After"] == "1"
    assert RateLimitError("x", retry_after_s=2.1).headers["Retry-After"] == "3"

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


def test_retry_after_falls_back_to_the_exhausted_ratelimit_reset() -> None:
    # Azure's and OpenAI's x-ratelimit-* headers: the reset of the limit that ran out.
    headers = {
        "x-ratelimit-remaining-requests": "12",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0.5s",
    }
    assert retry_after_s(headers) == 360.5
    assert (
        retry_after_s({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20ms"}) == 0.02
    )
    assert retry_after_s({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "1s"}) is None
    assert retry_after_s({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "later"}) is None
    # retry-after-ms, then Retry-After, win over the reset.
    assert retry_after_s({"retry-after-ms": "250", "Retry-After": "1", **headers}) == 0.25
    assert retry_after_s({"Retry-After": "2", **headers}) == 2.0


def test_azure_content_filter_error_keeps_its_innererror() -> None:
    inner = {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {"hate": {"filtered": True}}}
    azure = {
        "error": {
            "code": "content_filter",
            "message": "filtered",
            "param": "prompt",
            "type": None,
            "status": 400,
            "innererror": inner,
        }
    }
    err = status_error("az", 400, orjson.dumps(azure), {})
    shown = err.to_dict()["error"]
    assert (
        err.status == 400 and shown["code"] == "content_filter" and shown["type"] == "invalid_request_error"
    )
    assert shown["innererror"] == inner and shown["param"] == "prompt"


def test_retry_after_header_rounds_up() -> None:
    assert RateLimitError("x", retry_after_s=0.2).headers["Retry-After"] == "1"
    assert RateLimitError("x", retry_after_s=2.1).headers["Retry-After"] == "3"

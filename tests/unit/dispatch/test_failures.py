"""The failure-reason table: what retry_on accepts, the defaults, and what counts against a circuit."""

from __future__ import annotations

from gateway.dispatch.failures import DEFAULT_RETRY_ON, RETRYABLE, failure, is_unwell, status_error
from gateway.errors import UpstreamError, UpstreamRateLimitError, UpstreamStatusError, UpstreamTimeoutError


def test_retry_on_accepts_the_same_reasons_as_before_the_table_and_the_new_ones() -> None:
    before = {
        "connect",
        "connect_timeout",
        "first_token_timeout",
        "total_timeout",
        "upstream_disconnected",
        "stream_incomplete",
        "malformed_chunk",
        "429",
        "500",
        "502",
        "503",
        "504",
    }
    new = {
        "first_byte_timeout",
        "body_timeout",
        "empty_answer",
        "invalid_answer",
        "error_answer",
        "upstream_auth_failed",
        "upstream_redirect",
    }
    assert set(RETRYABLE) == before | new
    assert set(RETRYABLE) - set(DEFAULT_RETRY_ON) == {"total_timeout", "stream_incomplete"}


def test_upstream_faults_count_against_the_circuit_and_client_faults_do_not() -> None:
    unwell = [failure("connect", "x"), failure("idle_timeout", "x"), status_error("d", 500, b"", {})]
    # Rejected credentials are the deployment's fault (a revoked key): they count too.
    unwell += [status_error("d", s, b"{}", {}) for s in (401, 403)]
    unwell += [
        failure(r, "x") for r in ("first_byte_timeout", "empty_answer", "invalid_answer", "error_answer")
    ]
    well = [status_error("d", s, b"{}", {}) for s in (400, 404, 408, 429, 501)]
    assert all(is_unwell(e) for e in unwell)
    assert not any(is_unwell(e) for e in well)


def test_every_upstream_failure_is_an_upstream_error() -> None:
    assert isinstance(status_error("d", 429, b"", {}), UpstreamRateLimitError)
    assert isinstance(status_error("d", 422, b"{}", {}), UpstreamStatusError)
    assert isinstance(failure("first_token_timeout", "x"), UpstreamTimeoutError)
    assert all(isinstance(status_error("d", s, b"", {}), UpstreamError) for s in (400, 401, 429, 503, 504))

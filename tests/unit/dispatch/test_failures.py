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


def test_every_upstream_failure_has_a_plain_client_message_without_its_detail() -> None:
    from gateway.dispatch.failures import FAILURES, client_message, failure, status_error
    from gateway.errors import UpstreamUnavailableError

    for reason, row in FAILURES.items():
        if row.code is None and reason != "429":
            continue  # the upstream's own 4xx about the request: relayed as it said it
        statuses = {"upstream_auth_failed": 401, "upstream_redirect": 302, "upstream_not_found": 404}
        statuses |= {"upstream_timed_out": 408, "upstream_failed": 520}
        if reason.isdigit() or reason in statuses:
            status = int(reason) if reason.isdigit() else statuses[reason]
            err = status_error(
                "secret-dep", status, b'{"error": {"message": "ConnectionResetError(104)"}}', {}
            )
            assert err.failure == reason
        else:
            err = failure(
                reason, "deployment 'secret-dep' failed: ClientPayloadError: ConnectionResetError(104)"
            )
        message = client_message(err)
        assert message and message.startswith("The ") and message.endswith("."), (reason, message)
        assert "secret-dep" not in message and "Error" not in message, (reason, message)
    relayed = status_error(
        "secret-dep", 400, b'{"error": {"message": "too long", "code": "context_length_exceeded"}}', {}
    )
    assert client_message(relayed) is None
    assert client_message(status_error("d", 503, b"", {})) == "The upstream is unavailable (HTTP 503)."
    opened = UpstreamUnavailableError(
        "no deployment can take the request now: secret-dep has its circuit open"
    )
    assert client_message(opened) == "No deployment can take the request now; retry shortly."


def test_deployment_names_are_shown_only_to_the_callers_the_policy_trusts() -> None:
    from gateway.policy import ErrorsPolicy

    assert not ErrorsPolicy().shows_deployment("ops")
    assert ErrorsPolicy(expose_deployments=True).shows_deployment(None)
    listed = ErrorsPolicy(expose_deployments=["ops"])
    assert listed.shows_deployment("ops") and not listed.shows_deployment("team-a")
    assert not listed.shows_deployment(None)

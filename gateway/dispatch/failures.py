"""The failure-reason table: every way an attempt can fail, and what each one means.

One row per reason. The retry policy (``retries.retry_on`` and its default), the circuit
breakers, fallback, the error the client sees, span attributes and metrics all read this
table; nothing else spells a reason out.

============================  =======================  =====  ======  ========  ====  ======
reason                        code the client sees     retry  unwell  fallback  same  status
============================  =======================  =====  ======  ========  ====  ======
connect                       connect_failed           yes    yes     yes       yes   502
connect_timeout               connect_timeout          yes    yes     yes       yes   504
first_token_timeout           first_token_timeout      yes    yes     yes       yes   504
first_byte_timeout            first_byte_timeout       yes    yes     yes       yes   504
total_timeout                 total_timeout            no     yes     yes       yes   504
idle_timeout                  idle_timeout             no     yes     no        no    504
body_timeout                  body_timeout             yes    yes     yes       yes   504
upstream_disconnected         upstream_disconnected    yes    yes     yes       yes   502
stream_incomplete             stream_incomplete        no     yes     yes       yes   502
malformed_chunk               malformed_chunk          yes    yes     yes       yes   502
empty_answer                  empty_answer             yes    yes     yes       yes   502
invalid_answer                invalid_answer           yes    yes     yes       yes   502
error_answer                  error_answer             yes    yes     yes       yes   502
429                           (upstream's) rate_limit  yes    no      yes       yes   429
500 / 502                     upstream_error           yes    yes     yes       yes   502
503                           upstream_unavailable     yes    yes     yes       yes   503
504                           upstream_timeout         yes    yes     yes       yes   504
upstream_auth_failed (401/3)  upstream_auth_failed     yes    yes     yes       no    502
upstream_redirect (3xx)       upstream_redirect        yes    yes     yes       no    502
upstream_not_found            upstream_not_found       no     no      no        no    502
upstream_timed_out (408)      upstream_timeout         no     no      no        no    504
upstream_failed (other 5xx)   upstream_error           no     no      no        no    502
client_error (other 4xx)      (upstream's)             no     no      no        no    (upstream's)
============================  =======================  =====  ======  ========  ====  ======

- *retry*: in ``retries.retry_on`` unless the policy lists its own.
- *unwell*: counts against the deployment's circuit (a client's 4xx or a busy 429 do not).
- *fallback*: may be retried at all, on another deployment of the route or of a fallback
  tier; exactly these reasons may be listed in ``retry_on``. ``idle_timeout`` strikes
  after bytes went to the client, so nothing can take over.
- *same*: a retry may go to the deployment that just failed (after a backoff). A
  deployment that rejected the gateway's credentials will do so again: only the other
  deployments are tried.

What each new-style reason means: ``first_byte_timeout``, a non-stream answer's first body
byte did not arrive within ``first_byte_s``; ``body_timeout``, its body then stopped for
``idle_s``; ``upstream_redirect``, the upstream answered a 3xx: the gateway never follows
a redirect (it would re-send the prompt and the deployment's key to wherever the upstream
points, loopback included) and never takes one for an answer, so a ``base_url`` that
redirects is a misconfigured deployment, tried no more, and others are; ``empty_answer``,
a 200 with an empty body or a stream that ended before its first complete event;
``invalid_answer``, a 200 whose body is not the endpoint's JSON (truncated, invalid, no
``choices``/``data``); ``error_answer``, a 200 whose body (or a stream's first events,
before anything reached the client) is an error object.

A failure that stands for an upstream HTTP status keeps that status as its reason name
(``"429"``, ``"401"``, ``"520"``), which is what ``retry_on``, spans and logs match; its
row is the one the provider adapter classified the status into.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gateway.dispatch.backoff import retry_after_s
from gateway.errors import (
    SwitchyardError,
    UpstreamError,
    UpstreamRateLimitError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)


@dataclass(frozen=True, slots=True)
class Failure:
    """One row of the table (see the module docstring)."""

    reason: str
    code: str | None
    """The error code the client sees; ``None``: the upstream's own code is relayed."""
    retried_by_default: bool
    unwell: bool
    falls_back: bool
    same_deployment: bool
    """A retry may go to the deployment that failed (else only to the others)."""
    client_status: int | None
    """``None``: the upstream's own status is relayed."""
    error: type[UpstreamError]


def _row(
    reason: str,
    code: str | None,
    error: type[UpstreamError],
    retry: bool,
    unwell: bool,
    falls_back: bool,
    same: bool | None = None,
) -> Failure:
    status = error.http_status if error is not UpstreamStatusError else None
    same_deployment = falls_back if same is None else same
    return Failure(reason, code, retry, unwell, falls_back, same_deployment, status, error)


_Err, _Timeout, _Unavailable = UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
Y, N = True, False
# fmt: off
_ROWS = (
    #    reason                   code                     error                   retry unwell fallback same
    _row("connect",               "connect_failed",        _Err,                   Y,    Y,     Y),
    _row("connect_timeout",       "connect_timeout",       _Timeout,               Y,    Y,     Y),
    _row("first_token_timeout",   "first_token_timeout",   _Timeout,               Y,    Y,     Y),
    _row("first_byte_timeout",    "first_byte_timeout",    _Timeout,               Y,    Y,     Y),
    _row("total_timeout",         "total_timeout",         _Timeout,               N,    Y,     Y),
    _row("idle_timeout",          "idle_timeout",          _Timeout,               N,    Y,     N),
    _row("body_timeout",          "body_timeout",          _Timeout,               Y,    Y,     Y),
    _row("upstream_disconnected", "upstream_disconnected", _Err,                   Y,    Y,     Y),
    _row("stream_incomplete",     "stream_incomplete",     _Err,                   N,    Y,     Y),
    _row("malformed_chunk",       "malformed_chunk",       _Err,                   Y,    Y,     Y),
    _row("empty_answer",          "empty_answer",          _Err,                   Y,    Y,     Y),
    _row("invalid_answer",        "invalid_answer",        _Err,                   Y,    Y,     Y),
    _row("error_answer",          "error_answer",          _Err,                   Y,    Y,     Y),
    _row("429",                   None,                    UpstreamRateLimitError, Y,    N,     Y),
    _row("500",                   "upstream_error",        _Err,                   Y,    Y,     Y),
    _row("502",                   "upstream_error",        _Err,                   Y,    Y,     Y),
    _row("503",                   "upstream_unavailable",  _Unavailable,           Y,    Y,     Y),
    _row("504",                   "upstream_timeout",      _Timeout,               Y,    Y,     Y),
    _row("upstream_auth_failed",  "upstream_auth_failed",  _Err,                   Y,    Y,     Y,       N),
    _row("upstream_redirect",     "upstream_redirect",     _Err,                   Y,    Y,     Y,       N),
    _row("upstream_not_found",    "upstream_not_found",    _Err,                   N,    N,     N),
    _row("upstream_timed_out",    "upstream_timeout",      _Timeout,               N,    N,     N),
    _row("upstream_failed",       "upstream_error",        _Err,                   N,    N,     N),
    _row("client_error",          None,                    UpstreamStatusError,    N,    N,     N),
)
# fmt: on

# What a client reads for each row: plain words, never an exception's text, the upstream's
# own answer or a deployment's name (those are the error's detail: the log line and the
# trace keep it). An upstream status is added as "(HTTP 503)".
_PLAIN: Mapping[str, str] = {
    "connect": "The upstream could not be reached.",
    "connect_timeout": "The upstream could not be reached in time.",
    "first_token_timeout": "The upstream sent no first token in time.",
    "first_byte_timeout": "The upstream sent no answer in time.",
    "total_timeout": "The request did not finish within its time limit.",
    "idle_timeout": "The upstream stopped sending in the middle of the answer.",
    "body_timeout": "The upstream stopped sending its answer.",
    "upstream_disconnected": "The connection to the upstream broke.",
    "stream_incomplete": "The upstream ended the stream before it finished.",
    "malformed_chunk": "The upstream sent an event that is not valid.",
    "empty_answer": "The upstream sent an empty answer.",
    "invalid_answer": "The upstream sent an answer that is not valid.",
    "error_answer": "The upstream answered with an error.",
    "429": "The upstream is rate limited; retry after the time Retry-After gives.",
    "500": "The upstream failed.",
    "502": "The upstream failed.",
    "503": "The upstream is unavailable.",
    "504": "The upstream timed out.",
    "upstream_auth_failed": "The upstream rejected the gateway's credentials (its operator must fix them).",
    "upstream_redirect": "The upstream answered a redirect, which the gateway does not follow.",
    "upstream_not_found": "The upstream does not serve the model it was asked for.",
    "upstream_timed_out": "The upstream timed out.",
    "upstream_failed": "The upstream failed.",
}
_NO_DEPLOYMENT = "No deployment can take the request now; retry shortly."

FAILURES: Mapping[str, Failure] = {row.reason: row for row in _ROWS}
"""Reason name -> row."""

TIMEOUTS: frozenset[str] = frozenset(
    row.reason for row in _ROWS if row.error is _Timeout and row.reason.endswith("_timeout")
)
"""The gateway's own timers: a deployment that trips them may be slow because busy rather
than down, so the circuit judges them against its peers (an upstream's 504 is not here)."""

RETRYABLE: tuple[str, ...] = tuple(row.reason for row in _ROWS if row.falls_back)
"""The reasons ``retries.retry_on`` may list, in table order."""

DEFAULT_RETRY_ON: tuple[str, ...] = tuple(row.reason for row in _ROWS if row.retried_by_default)
"""What ``retries.retry_on`` is when the policy does not say."""

_codes = [row.code for row in _ROWS]
_BY_CODE = {row.code: row for row in _ROWS if row.code is not None and _codes.count(row.code) == 1}
"""An error built elsewhere (a replica set that is not ready) is placed by its code."""


def failure_of(exc: SwitchyardError) -> Failure | None:
    """The row of a failed attempt's error; ``None`` for an error that is not the upstream's."""
    if isinstance(exc, UpstreamError) and exc.failure is not None:
        return FAILURES[exc.failure]
    return _BY_CODE.get(exc.code or "")


def client_message(exc: SwitchyardError) -> str | None:
    """The plain message a client sees for an upstream failure; ``None`` when the error's own
    message is meant for the client (the gateway's own words, or an upstream's 4xx about
    the request, relayed as it said it)."""
    if not isinstance(exc, UpstreamError) or isinstance(exc, UpstreamStatusError):
        return None
    if exc.public is not None:
        return exc.public
    row = failure_of(exc)
    if row is None or row.error is UpstreamStatusError:
        return None
    if exc.failure is None and exc.upstream_status is None and row.reason == "503":
        # Not an upstream's 503: every circuit open, or a replica set not ready yet.
        return _NO_DEPLOYMENT
    text = _PLAIN[row.reason]
    return text if exc.upstream_status is None else f"{text[:-1]} (HTTP {exc.upstream_status})."


def failure_reason(exc: SwitchyardError) -> str:
    """The reason a retry policy, span and log see: the upstream's status, else the row's name."""
    if exc.upstream_status is not None:
        return str(exc.upstream_status)
    row = failure_of(exc)
    return row.reason if row is not None else exc.code or ""


def may_retry(exc: SwitchyardError, retry_on: Collection[str]) -> bool:
    """Whether ``retry_on`` lists the failure: by the upstream's status (``"503"``) or by its
    row (``upstream_auth_failed`` stands for every status the adapter put in that row)."""
    if failure_reason(exc) in retry_on:
        return True
    row = failure_of(exc)
    return row is not None and row.reason in retry_on


def retries_same_deployment(exc: SwitchyardError) -> bool:
    """Whether a retry may go to the deployment that just failed this way."""
    row = failure_of(exc)
    return row is None or row.same_deployment


def is_unwell(exc: SwitchyardError) -> bool:
    """Whether the failure counts against the deployment's circuit."""
    row = failure_of(exc)
    return row is not None and row.unwell


def failure(reason: str, message: str) -> UpstreamError:
    """The error for a failure that is not an upstream status (``connect``, ``idle_timeout`` ...)."""
    row = FAILURES[reason]
    error = row.error(message, code=row.code)
    error.failure = reason
    return error


def http_failure(status: int) -> str:
    """The row of an upstream's error status under plain HTTP meaning (what OpenAI-style
    APIs say); a provider adapter whose API means something else overrides this."""
    key = str(status)
    if key in FAILURES:
        return key
    if status in (401, 403):
        return "upstream_auth_failed"
    if 300 <= status < 400:
        return "upstream_redirect"
    if status == 404:
        return "upstream_not_found"
    if status == 408:
        return "upstream_timed_out"
    if status >= 500:
        return "upstream_failed"
    return "client_error"


def status_error(
    name: str,
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    reason: str | None = None,
) -> UpstreamError:
    """The error a client sees for an upstream's error status, built from its ``reason`` row
    (by default :func:`http_failure`).

    The client's own mistakes (400, 413, 422 ...) are relayed as the upstream said them;
    the gateway's configuration faults (401/403/404 from the upstream) and upstream
    failures become 502/503/504, so a client never blames its own key for ours.
    """
    row = FAILURES[reason or http_failure(status)]
    relayed = UpstreamStatusError(status, body)
    detail = relayed.message
    error: UpstreamError
    if row.error is UpstreamStatusError:
        error = relayed
    elif row.error is UpstreamRateLimitError:
        error = UpstreamRateLimitError(
            f"deployment '{name}' is rate limited: {detail}",
            retry_after_s=retry_after_s(headers),
            code=relayed.code or "rate_limit_exceeded",
        )
    elif row.reason == "upstream_auth_failed":
        # The upstream's own text is left out: providers echo part of the key they were sent.
        error = row.error(
            f"deployment '{name}' rejected the gateway's credentials (HTTP {status}); "
            "check the key its api_key_env names",
            code=row.code,
        )
    elif row.reason == "upstream_redirect":
        location = str(headers.get("Location", ""))[:200] or "no Location"
        error = row.error(
            f"deployment '{name}' answered a redirect (HTTP {status} to {location}), which the gateway "
            "does not follow; check its base_url",
            code=row.code,
        )
    elif row.reason == "upstream_not_found":
        error = row.error(f"deployment '{name}' does not serve its model (HTTP 404): {detail}", code=row.code)
    elif row.error is UpstreamTimeoutError:
        error = row.error(f"deployment '{name}' timed out (HTTP {status}): {detail}", code=row.code)
    elif row.error is UpstreamUnavailableError:
        error = row.error(f"deployment '{name}' is unavailable (HTTP {status}): {detail}", code=row.code)
    else:
        error = row.error(f"deployment '{name}' failed (HTTP {status}): {detail}", code=row.code)
    error.failure = row.reason
    error.upstream_status = status
    return error

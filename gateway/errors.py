"""One error hierarchy for the gateway, mapped to OpenAI's error JSON in one place.

Every failure a client can see is a :class:`SwitchyardError`. The server turns it
into ``{"error": {"message", "type", "param", "code"}}`` with the status and headers
the subclass names, so the official SDKs raise their own typed exceptions
(``BadRequestError``, ``NotFoundError``, ``RateLimitError`` ...)::

    SwitchyardError                   500 server_error
    ├── InvalidRequestError           400
    ├── AuthenticationError           401
    ├── PermissionDeniedError         403
    ├── NotFoundError                 404
    │   └── ModelNotFoundError
    ├── MethodNotAllowedError         405
    ├── RequestTooLargeError          413
    ├── RateLimitError                429 (Retry-After)
    │   └── UpstreamRateLimitError    an upstream's 429 (also an UpstreamError)
    └── UpstreamError                 502: an upstream failed; parent of every upstream failure
        ├── UpstreamUnavailableError  503
        │   └── RedisUnavailableError the gateway's own Redis (admin, keys), 503 redis_unavailable
        ├── UpstreamTimeoutError      504
        ├── UpstreamStatusError       an upstream's 4xx about the request, relayed as it said it
        └── UpstreamRateLimitError

Which upstream failure becomes which class, and whether it is retried or counts against
a circuit, is :mod:`gateway.dispatch.failures`' table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson


class SwitchyardError(Exception):
    """Base class: an error with an HTTP status and OpenAI's error fields."""

    http_status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = self.http_status
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = dict(headers or {})
        self.upstream_status: int | None = None
        """The upstream's HTTP status when this error stands for one."""

    def to_dict(self) -> dict[str, Any]:
        """The error as OpenAI's JSON object."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


class InvalidRequestError(SwitchyardError):
    """400: the request body or a parameter is wrong."""

    http_status = 400
    error_type = "invalid_request_error"


class AuthenticationError(SwitchyardError):
    """401: no key, or a key that is not valid."""

    http_status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(SwitchyardError):
    """403: a valid key that may not do this."""

    http_status = 403
    error_type = "invalid_request_error"
    default_code = "permission_denied"


class NotFoundError(SwitchyardError):
    """404: an unknown model or path."""

    http_status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFoundError(NotFoundError):
    """404: the policy maps no deployment or tier to this model name."""

    default_code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model '{model}' does not exist or is not served by this gateway.",
            param="model",
        )


class MethodNotAllowedError(SwitchyardError):
    """405: a known path with the wrong method."""

    http_status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class RequestTooLargeError(SwitchyardError):
    """413: the body is over the configured size limit."""

    http_status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimitError(SwitchyardError):
    """429: too many requests or tokens; carries Retry-After."""

    http_status = 429
    error_type = "rate_limit_error"
    default_code: ClassVar[str | None] = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        merged = dict(headers or {})
        if retry_after_s is not None:
            # Retry-After is whole seconds; round up so a client never retries early.
            merged["Retry-After"] = str(max(1, int(-(-retry_after_s // 1))))
        super().__init__(message, code=code, headers=merged)
        self.retry_after_s = retry_after_s


class UpstreamError(SwitchyardError):
    """502: the upstream failed (connection refused or reset, 5xx, malformed answer).

    The parent of every upstream failure. ``failure`` names its row in
    :mod:`gateway.dispatch.failures` when dispatch built it from that table.
    """

    http_status = 502
    error_type = "upstream_error"
    default_code: ClassVar[str | None] = "upstream_error"
    failure: str | None = None
    public: str | None = None
    """What the client reads instead of ``message`` (which may name deployments or quote an
    exception), when the one who raised it knows better than the failure's row."""


class UpstreamRateLimitError(RateLimitError, UpstreamError):
    """429: the upstream is rate limited; carries its Retry-After."""


class UpstreamUnavailableError(UpstreamError):
    """503: no deployment can take the request (all down or circuits open)."""

    http_status = 503
    error_type = "upstream_error"
    default_code = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    """504: an upstream timeout; ``code`` names which one (``first_token_timeout`` ...)."""

    http_status = 504
    error_type = "timeout_error"
    default_code = "upstream_timeout"


class UpstreamStatusError(UpstreamError):
    """An upstream's own 4xx answer, passed to the client with its status and body.

    The upstream already speaks OpenAI's format; relaying it keeps its message,
    param and code (``context_length_exceeded`` ...) intact.
    """

    error_type = "invalid_request_error"
    default_code = None

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.body = body
        parsed = _error_fields(body)
        super().__init__(
            str(parsed.get("message") or f"upstream answered HTTP {status}"),
            param=_str_or_none(parsed.get("param")),
            code=_str_or_none(parsed.get("code")),
            headers=headers,
        )
        self.status = self.upstream_status = status
        self.upstream_type = _str_or_none(parsed.get("type"))
        inner = parsed.get("innererror")
        # Azure says which content filter refused the request there; clients that know Azure read it.
        self.innererror: dict[str, Any] | None = inner if isinstance(inner, dict) else None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.upstream_type:
            out["error"]["type"] = self.upstream_type
        if self.innererror is not None:
            out["error"]["innererror"] = self.innererror
        return out


def _error_fields(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {"message": body[:500].decode("utf-8", "replace")} if body else {}
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return err
        if isinstance(err, str):
            return {"message": err}
        # vLLM answers some errors as {"object": "error", "message": ...}.
        if "message" in data:
            return data
    return {}


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def sse_error_event(error: SwitchyardError) -> bytes:
    """An SSE event that ends a started stream with an error the SDKs raise on."""
    return b"data: " + error.to_json() + b"\n\n"


class RedisUnavailableError(UpstreamUnavailableError):
    """503: the gateway's own Redis does not answer, so what needs it (keys, costs, stats, an
    unknown key's check) cannot be done now; ``code`` says which (``redis_unavailable`` ...)."""

    default_code = "redis_unavailable"

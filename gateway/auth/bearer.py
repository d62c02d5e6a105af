"""The one reader of ``Authorization: Bearer <token>`` headers (virtual keys, the admin key,
the dashboard's per-client labels)."""

from __future__ import annotations


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None.

    The scheme is matched case-insensitively (RFC 7235: ``bearer`` and ``BEARER`` name the
    same scheme), and a header without a token is no token."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None

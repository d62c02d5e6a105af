"""Escalation: a fast answer that fails a check the policy names is asked again, once, of a
stronger tier (non-stream requests only: a stream's bytes are already with the client)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.policy import Policy
from gateway.routing.resolve import Route, tier_route


def escalation_reason(policy: Policy, route: Route, body: Mapping[str, Any], answer: bytes) -> str | None:
    """The failed check (``invalid_json``, ``empty``, ``length``), or None to keep the answer."""
    escalation = policy.routing.escalation
    if not escalation.enabled or route.tier not in escalation.from_tiers or route.tier == escalation.to:
        return None
    try:
        obj = orjson.loads(answer)
        choice = obj["choices"][0]
        message = choice.get("message") or {}
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return None
    content = message.get("content") if isinstance(message, dict) else None
    tool_calls = message.get("tool_calls") if isinstance(message, dict) else None
    checks = escalation.on
    fmt = body.get("response_format")
    if (
        "invalid_json" in checks
        and isinstance(fmt, dict)
        and fmt.get("type") in ("json_object", "json_schema")
    ):
        try:
            orjson.loads(content or "")
        except orjson.JSONDecodeError:
            return "invalid_json"
    if "empty" in checks and not (content or "").strip() and not tool_calls:
        return "empty"
    client_limit = body.get("max_tokens") or body.get("max_completion_tokens")
    if "length" in checks and choice.get("finish_reason") == "length" and not client_limit:
        return "length"
    return None


def escalation_route(
    policy: Policy, route: Route, body: Mapping[str, Any], answer: bytes
) -> tuple[str, Route] | None:
    """The failed check and the escalation tier's route when ``answer`` fails a check the
    policy names, or None to keep the answer."""
    reason = escalation_reason(policy, route, body, answer)
    if reason is None:
        return None
    to = policy.routing.escalation.to
    return reason, tier_route(policy, to, f"escalation:{reason}", escalated_from=route.tier)

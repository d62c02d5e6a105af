"""How long to wait before trying again: an upstream's Retry-After, or full-jitter backoff.

Used by dispatch (retrying a deployment) and by ``switchyard batch`` (retrying the gateway).
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Mapping

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds from a ``retry-after-ms`` (Azure OpenAI, OpenAI) or ``Retry-After``
    (delta-seconds or HTTP date) header; without either, the ``x-ratelimit-reset-requests``
    / ``x-ratelimit-reset-tokens`` of a limit whose ``x-ratelimit-remaining-*`` is 0."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return _ratelimit_reset_s(headers)
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _ratelimit_reset_s(headers: Mapping[str, str]) -> float | None:
    """The longest reset (``6m0s``, ``1.5s``, ``20ms`` or plain seconds) among the exhausted
    ``x-ratelimit-*`` limits; ``None`` when no limit says it is exhausted."""
    longest: float | None = None
    for limit in ("requests", "tokens"):
        if headers.get(f"x-ratelimit-remaining-{limit}", "").strip() != "0":
            continue
        reset = _duration_s(headers.get(f"x-ratelimit-reset-{limit}", ""))
        if reset is not None and (longest is None or reset > longest):
            longest = reset
    return longest


def _duration_s(text: str) -> float | None:
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def full_jitter_s(retry: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Before the ``retry``-th retry (1-based): uniform in ``[0, min(max_s, base_s * 2**(retry-1))]``."""
    return (rng or random).uniform(0.0, min(max_s, base_s * 2 ** (retry - 1)))

"""How long to wait before trying again: an upstream's Retry-After, or full-jitter backoff.

Used by dispatch (retrying a deployment) and by ``switchyard batch`` (retrying the gateway).
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds from a ``Retry-After`` (delta-seconds or HTTP date) or ``retry-after-ms`` header."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def full_jitter_s(retry: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Before the ``retry``-th retry (1-based): uniform in ``[0, min(max_s, base_s * 2**(retry-1))]``."""
    return (rng or random).uniform(0.0, min(max_s, base_s * 2 ** (retry - 1)))

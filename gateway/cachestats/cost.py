"""What a request cost, from the provider's usage and the deployment's prices.

Providers report cached tokens *inside* ``prompt_tokens``
(``usage.prompt_tokens_details.cached_tokens``), so the cached part is charged once, at
the cached price, and only the rest at the input price. Adding the cached tokens on top
of the full prompt price is the double count several gateways have shipped.

Prompt-cache *writes* (Anthropic's ``cache_creation_input_tokens``, which the provider
adapter reports as ``prompt_tokens_details.cache_write_tokens``, the 1-hour share as
``cache_write_1h_tokens``) are also inside ``prompt_tokens`` and are charged once, at
their premium over the input price: 1.25x for 5-minute entries, 2x for 1-hour ones.
"""

from __future__ import annotations

from typing import Any

from gateway.policy import Price

NANO_USD = 1_000_000_000
CACHE_WRITE_5M_PREMIUM = 1.25
CACHE_WRITE_1H_PREMIUM = 2.0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    """``(prompt, cached, completion)`` tokens of an OpenAI usage object; cached <= prompt."""
    if not usage:
        return 0, 0, 0
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return prompt, min(cached, prompt), completion


def cache_write_tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    """``(5-minute, 1-hour)`` prompt-cache writes of an OpenAI-shaped usage object."""
    details = usage.get("prompt_tokens_details") if usage else None
    if not isinstance(details, dict):
        return 0, 0
    written = _int(details.get("cache_write_tokens"))
    hour = min(_int(details.get("cache_write_1h_tokens")), written)
    return written - hour, hour


def cost_usd(price: Price | None, usage: dict[str, Any] | None) -> float:
    """The request's cost in USD; 0 when the deployment has no price."""
    if price is None:
        return 0.0
    prompt, cached, completion = usage_tokens(usage)
    five, hour = cache_write_tokens(usage)
    five = min(five, prompt - cached)
    hour = min(hour, prompt - cached - five)
    cached_price = price.cached_input if price.cached_input is not None else price.input
    plain = prompt - cached - five - hour
    written = (five * CACHE_WRITE_5M_PREMIUM + hour * CACHE_WRITE_1H_PREMIUM) * price.input
    return (plain * price.input + written + cached * cached_price + completion * price.output) / 1e6


def cost_nano_usd(price: Price | None, usage: dict[str, Any] | None) -> int:
    """:func:`cost_usd` in nano-USD (integer counters in Redis; a 10-token call still counts)."""
    return round(cost_usd(price, usage) * NANO_USD)

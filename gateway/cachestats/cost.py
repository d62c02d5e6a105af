"""What a request cost, from the provider's usage and the deployment's prices.

Providers report cached tokens *inside* ``prompt_tokens``
(``usage.prompt_tokens_details.cached_tokens``), so the cached part is charged once, at
the cached price, and only the rest at the input price. Adding the cached tokens on top
of the full prompt price is the double count several gateways have shipped.
"""

from __future__ import annotations

from typing import Any

from gateway.policy import Price

NANO_USD = 1_000_000_000


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


def cost_usd(price: Price | None, usage: dict[str, Any] | None) -> float:
    """The request's cost in USD; 0 when the deployment has no price."""
    if price is None:
        return 0.0
    prompt, cached, completion = usage_tokens(usage)
    cached_price = price.cached_input if price.cached_input is not None else price.input
    return ((prompt - cached) * price.input + cached * cached_price + completion * price.output) / 1e6


def cost_nano_usd(price: Price | None, usage: dict[str, Any] | None) -> int:
    """:func:`cost_usd` in nano-USD (integer counters in Redis; a 10-token call still counts)."""
    return round(cost_usd(price, usage) * NANO_USD)

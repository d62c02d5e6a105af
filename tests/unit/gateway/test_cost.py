"""Cost from usage: cached tokens are part of prompt_tokens and are charged once, at the cached price."""

from __future__ import annotations

import pytest

from gateway.auth.keys import KeyRecord, split_token
from gateway.auth.limits import duration
from gateway.cachestats.cost import cost_nano_usd, cost_usd
from gateway.policy import Price

PRICE = Price(input=2.0, cached_input=0.5, output=8.0)


def test_cached_tokens_are_charged_once_at_the_cached_price() -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 800}}
    # 200 uncached at 2.0 + 800 cached at 0.5 + 100 output at 8.0, per million.
    assert cost_usd(PRICE, usage) == pytest.approx((200 * 2.0 + 800 * 0.5 + 100 * 8.0) / 1e6)
    # Not the double count: all 1,000 at the input price plus the 800 again at the cached price.
    assert cost_usd(PRICE, usage) < (1000 * 2.0 + 800 * 0.5 + 100 * 8.0) / 1e6


def test_cost_without_cache_details_without_price_and_with_odd_usage() -> None:
    assert cost_usd(PRICE, {"prompt_tokens": 10, "completion_tokens": 5}) == pytest.approx(60 / 1e6)
    assert cost_usd(None, {"prompt_tokens": 10}) == 0.0
    assert cost_usd(PRICE, None) == 0.0
    # cached_input unset: no discount known, cached tokens cost the input price.
    assert cost_usd(
        Price(input=1.0), {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 10}}
    ) == (pytest.approx(10 / 1e6))
    # A provider reporting more cached than prompt tokens is clamped, not charged negative.
    odd = {"prompt_tokens": 10, "completion_tokens": "x", "prompt_tokens_details": {"cached_tokens": 50}}
    assert cost_usd(PRICE, odd) == pytest.approx(10 * 0.5 / 1e6)
    assert cost_nano_usd(PRICE, {"prompt_tokens": 10, "completion_tokens": 5}) == 60_000


def test_key_format_and_model_permission() -> None:
    assert split_token("sk-sy-0123456789ab_secret") == ("0123456789ab", "secret")
    for bad in ("sk-sy-0123456789ab", "sk-sy-xyz_secret", "sk-other", "sk-sy-0123456789ab_", ""):
        assert split_token(bad) is None
    key = KeyRecord(key_id="0123456789ab", name="a", models=frozenset({"fast"}))
    assert key.allows("fast") and key.allows("auto", "fast") and not key.allows("strong", None)
    assert KeyRecord(key_id="0123456789ab", name="any").allows("whatever")


def test_reset_durations_read_like_openai() -> None:
    assert duration(0.02) == "20ms"
    assert duration(1.5) == "1.5s"
    assert duration(360) == "6m0s"
    assert duration(0) == "0s"

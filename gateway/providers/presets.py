"""The OpenAI-compatible providers' quirks, as data: one :class:`Preset` per provider name.

A policy names one as ``provider:`` (``provider: deepseek``); the policy takes its default
``base_url`` from here and :mod:`gateway.providers.registry` registers every name, served by
:class:`gateway.providers.compatible.CompatibleProvider`. docs/providers.md lists what
differs for each and where that is documented.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Preset:
    """What one OpenAI-compatible provider does differently from OpenAI."""

    base_url: str | None = None
    """The ``base_url`` a deployment gets when the policy sets none."""
    cached_tokens: tuple[str, ...] = ()
    """Path, from the answer (or stream chunk) object, of the cached prompt tokens when the
    provider reports them outside ``usage.prompt_tokens_details.cached_tokens``."""
    stream_usage: tuple[str, ...] = ("usage",)
    """Path of a stream chunk's usage object."""
    drop: tuple[str, ...] = ()
    """Request fields removed before sending: the provider rejects them, and the answer is
    the same without them (``stream_options``: the provider reports stream usage anyway)."""
    refuse: tuple[str, ...] = ()
    """Request fields the provider cannot honour: a request that sets one (to anything but
    its default) gets a 400 naming it."""
    drop_message_name: bool = False
    """Remove ``messages[].name`` (a hint the provider rejects)."""


PRESETS: Mapping[str, Preset] = {
    "ollama": Preset(base_url="http://127.0.0.1:11434/v1", refuse=("n",)),
    "groq": Preset(
        base_url="https://api.groq.com/openai/v1",
        stream_usage=("x_groq", "usage"),
        refuse=("logprobs", "top_logprobs", "logit_bias", "n"),
        drop_message_name=True,
    ),
    "together": Preset(base_url="https://api.together.xyz/v1"),
    "fireworks": Preset(base_url="https://api.fireworks.ai/inference/v1"),
    "deepseek": Preset(
        base_url="https://api.deepseek.com/v1", cached_tokens=("usage", "prompt_cache_hit_tokens")
    ),
    "mistral": Preset(base_url="https://api.mistral.ai/v1", drop=("stream_options",)),
    "openrouter": Preset(base_url="https://openrouter.ai/api/v1"),
    "xai": Preset(base_url="https://api.x.ai/v1"),
    "sglang": Preset(base_url="http://127.0.0.1:30000/v1"),
    "tgi": Preset(base_url="http://127.0.0.1:8080/v1", refuse=("n",)),
    "llamacpp": Preset(base_url="http://127.0.0.1:8080/v1", cached_tokens=("timings", "cache_n")),
}
"""Provider name -> its quirks. Every name is registered in
:data:`gateway.providers.registry.PROVIDERS`."""


PUBLIC_BASE_URLS: Mapping[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
}
"""The public API a deployment of these providers reaches when the policy sets no ``base_url``."""


def default_base_url(provider: str) -> str | None:
    """The ``base_url`` a deployment of ``provider`` gets when the policy sets none: the
    provider's public API, or its preset's (``None``: it has none, so the policy must set one)."""
    preset = PRESETS.get(provider)
    return preset.base_url if preset is not None else PUBLIC_BASE_URLS.get(provider)

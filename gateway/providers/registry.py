"""Provider name (a deployment's ``provider:`` in the policy) -> adapter class."""

from __future__ import annotations

from gateway.providers.base import Provider
from gateway.providers.openai import OpenAIProvider
from gateway.providers.vllm import VllmProvider

PROVIDERS: dict[str, type[Provider]] = {
    "openai": OpenAIProvider,
    "vllm": VllmProvider,
}
"""Every provider a policy may name; the policy check rejects any other."""

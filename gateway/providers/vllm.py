"""vLLM's dialect: OpenAI's, without ``prompt_cache_key`` (vLLM caches prefixes itself and
knows no such field), served by one URL or by a set of replicas the gateway watches."""

from __future__ import annotations

from gateway.providers.openai import OpenAIProvider


class VllmProvider(OpenAIProvider):
    """``provider: vllm`` at one URL (a replica set, :class:`gateway.replicas.upstream.ReplicaSetUpstream`,
    builds on it for ``launch:`` and ``replicas:``)."""

    sends_prompt_cache_key = False

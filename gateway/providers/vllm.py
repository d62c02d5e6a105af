"""vLLM's dialect: OpenAI's, without ``prompt_cache_key`` (vLLM caches prefixes itself and
knows no such field), served by one URL or by a set of replicas the gateway watches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.providers.openai import OpenAIProvider

if TYPE_CHECKING:
    from gateway.policy import Deployment
    from gateway.providers.base import Provider


class VllmProvider(OpenAIProvider):
    """``provider: vllm``; with ``launch:`` or ``replicas:``, a replica set."""

    sends_prompt_cache_key = False

    @classmethod
    def create(cls, name: str, deployment: Deployment) -> Provider:
        if deployment.launch is not None or deployment.replicas is not None:
            # gateway.replicas builds on this module, so it is imported only when used.
            from gateway.replicas.upstream import ReplicaSetUpstream

            return ReplicaSetUpstream(name, deployment)
        return cls(name, deployment)

"""Provider name (a deployment's ``provider:`` in the policy) -> the adapter class that speaks it.

The table names each adapter by its import path rather than importing it: the policy checks
``provider:`` against these names, and the adapters themselves are built from a policy's
deployments, so importing them here would tie the policy to every adapter in a circle.
"""

from __future__ import annotations

from gateway.providers.presets import PRESETS

PROVIDERS: dict[str, str] = {
    "openai": "gateway.providers.openai:OpenAIProvider",
    # A vLLM deployment is one URL or, with launch:/replicas:, a set of replicas the gateway watches.
    "vllm": "gateway.replicas.upstream:ReplicaSetUpstream",
    "anthropic": "gateway.providers.anthropic:AnthropicProvider",
    "azure": "gateway.providers.azure:AzureProvider",
    # The OpenAI-compatible providers: one adapter, a row each of presets.PRESETS for their quirks.
    **dict.fromkeys(PRESETS, "gateway.providers.compatible:CompatibleProvider"),
    # Google's Gemini API (an API key) and Gemini on Vertex AI (an OAuth token): one dialect.
    "gemini": "gateway.providers.gemini:GeminiProvider",
    "vertex": "gateway.providers.gemini:VertexProvider",
    # AWS Bedrock's Converse API, SigV4-signed (botocore, the [bedrock] extra).
    "bedrock": "gateway.providers.bedrock:BedrockProvider",
}
"""Every provider a policy may name (the policy check rejects any other), with its adapter."""

"""Anthropic's Messages API: the inbound ``/v1/messages`` endpoint, the request and answer
translations for Anthropic deployments, and its SSE events."""

"""Endpoint dialects: translations between OpenAI's wire format and other providers' APIs."""

"""Endpoint dialects: translations between the client-facing APIs (Responses, Messages) and upstream ones."""

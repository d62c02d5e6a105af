"""Logging (and, later, tracing and metrics)."""

"""Logging, Prometheus metrics and OpenTelemetry tracing."""

"""What a finished request leaves behind: the finished-request record, the structlog line,
Prometheus metrics and OpenTelemetry tracing."""

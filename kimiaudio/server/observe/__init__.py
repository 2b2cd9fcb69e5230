"""Metrics (Prometheus), the per-answer log line and logging setup."""

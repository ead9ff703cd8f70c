"""Prometheus: families and totals, the spec-decode diffing bridge and log line, the state dir."""

"""Metric records, per-rank log files and the run's event log."""

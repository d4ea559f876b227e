"""The per-worker train loop. It receives a frozen DistContext and a JobSpec; it never reads env vars."""

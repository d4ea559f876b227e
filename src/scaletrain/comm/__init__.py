"""Backend and device detection, environment variables, distributed context."""

"""Turning a validated config into a running job: the run directory, data preparation, Ray Train."""

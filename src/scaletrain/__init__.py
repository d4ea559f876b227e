"""scaletrain: one YAML from a single-device fine-tune to many GPUs and nodes on Ray Train."""

__version__ = "0.1.0"

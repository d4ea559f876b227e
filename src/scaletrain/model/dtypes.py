"""The dtype names scaletrain speaks, below everything that needs them: the short names of the precision policy
("fp32", "bf16", "fp16"), their sizes, and the names checkpoints write in config.json ("bfloat16", ...).

Its own module because both the model directory's facts (model_files.py: what dtype a checkpoint is stored in)
and the precision policy (precision.py) read it, and neither may import the other's module.
"""

from __future__ import annotations

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
TORCH_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def torch_dtype(name: str):
    """torch's dtype for "fp32", "bf16" or "fp16"."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def torch_name(name: str) -> str:
    """The config.json spelling of a short name ("bf16" -> "bfloat16")."""
    return {v: k for k, v in TORCH_NAMES.items()}[name]


def checkpoint_dtype(config: dict) -> str | None:
    """The dtype a checkpoint's config.json says it is stored in (``torch_dtype``, or transformers 5's ``dtype``)."""
    value = config.get("dtype") or config.get("torch_dtype")
    return TORCH_NAMES.get(str(value).removeprefix("torch.")) if value else None

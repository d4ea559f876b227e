"""What the driver hands every worker: the resolved config and the job's prepared facts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobSpec:
    config: dict  # Config.model_dump(); rebuilt and validated in the worker
    run_dir: str
    train_path: str
    eval_path: str
    pad_token_id: int
    vocab_size: int
    backend: str  # "nccl" or "gloo", chosen by the driver
    total_steps: int
    learning_rate: float  # after lr_scaling
    faults: tuple = ()  # injected faults (tests and drills), see worker/faults.py

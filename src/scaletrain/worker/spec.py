"""What the driver hands every worker: the resolved config and the job's prepared facts."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.model.tokenizer import Vocab


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
    # The model's memory shape (memory/estimate.py Shape), measured once by the driver on the meta device; each
    # worker's summary sets the plan for its own world size beside the measured peak. None: no estimate.
    memory_shape: dict | None = None
    # The run's URI when it lives on object storage (storage/): the workers' checkpoints and final model go there,
    # their other files to the driver through Ray (storage/relay.py); run_dir is then their own on their node.
    store: str | None = None
    # data.streaming: the shards the workers read (data/stream.py StreamSource.to_spec); train_path is then "".
    stream: dict | None = None
    # CPU workers: each binds its threads to its own block of the node's cores (comm/cores.py), as planned.
    bind_cores: bool = False

    @property
    def vocab(self) -> Vocab:
        return Vocab(self.vocab_size, self.pad_token_id)

"""The interface through which a training objective other than the token loss plugs into the trainer.

Preference tuning (DPO, KTO, ORPO, SimPO, reward models: worker/preference.py) and GRPO (worker/grpo.py)
implement it; the loop chooses one (``preference.objective_for``) and hands it to ``build_trainer``, so the trainer
and the step never import the module that implements it (as the launchers implement launch/launcher.py's interface).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from scaletrain.config.schema import TrainConfig


class Objective(Protocol):
    stats: tuple[str, ...]  # what a step records (sums between records, then means): one slot each, and a count

    def holds_reference(self, train: TrainConfig, lora: bool) -> bool:
        """Whether the trainer keeps a frozen copy of the initial model (built before the model is wrapped)."""

    def prepare(self, t, splits: dict, collate) -> dict:
        """The training and eval splits as this objective reads them (e.g. with reference log-probabilities)."""

    def begin_step(self, t, window: list[dict], step: int) -> list[dict]:
        """The micro-batches the step trains on, from the ones the data gave (GRPO: prompts -> their completions,
        rewarded; the others: the same)."""

    def micro_loss(self, t, batch: dict, n_micro: int) -> torch.Tensor:
        """This micro-batch's share of the step's loss; its statistics are added to ``t.objective_sums``."""

    def evaluate(self, t, data, collate) -> dict[str, float]:
        """The eval split's loss and statistics (every rank its shard, sums all-reduced)."""

    def record(self, sums: list[float]) -> dict[str, float]:
        """The metrics of a record from the statistics summed since the last one (all ranks' sums)."""

"""Rewards that score nothing (TRL's None: "not applicable"): a completion every reward function returned None for
has no reward, its group's advantages are 0 and it trains nothing. TRL warns per sample; here each step's whole
picture is judged once, from the rewards of every rank (the same tensor on each rank, so every rank takes the same
decision at the same step and none waits in a collective for one that stopped):

- the first step where a whole prompt group, or the whole step, is unscored is said (what each function left
  unscored, and what to check);
- ``monitor.alerts.unscored_steps`` steps in a row with nothing scored end the run: it would learn from nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verdict:
    notice: str | None = None  # said once: the first step with an unscored group
    stop: str | None = None  # the run ends: nothing scored for the configured number of steps in a row


class Unscored:
    def __init__(self, names: list[str], num_generations: int, stop_after: int):
        self.names, self.g, self.stop_after = names, num_generations, stop_after
        self.said = False
        self.in_a_row = 0  # generation steps in a row where no completion was scored

    def observe(self, rewards: torch.Tensor, step: int) -> Verdict:
        """``rewards``: [completions of the whole step, functions], NaN where a function returned None."""
        if rewards.numel() == 0:
            return Verdict()
        missing = torch.isnan(rewards)
        unscored = missing.all(dim=1)
        groups = unscored.view(-1, self.g).all(dim=1)
        nothing = bool(unscored.all())
        self.in_a_row = self.in_a_row + 1 if nothing else 0
        verdict = Verdict()
        per_func = ", ".join(f"{n} {int(missing[:, j].sum())}/{rewards.shape[0]}" for j, n in enumerate(self.names))
        if groups.any() and not self.said:
            self.said = True
            what = ("no completion of the step" if nothing else
                    f"{int(groups.sum())} of {groups.numel()} prompt groups")
            verdict.notice = (f"step {step}: the reward functions scored {what} (None, TRL's 'not applicable': "
                              f"{per_func}); an unscored group has advantage 0 and trains nothing (see "
                              f"rewards/NAME/none_ratio); check what each function needs from the data (its "
                              f"columns, rl.answer_column)")
        if self.stop_after and self.in_a_row >= self.stop_after:
            verdict.stop = (f"step {step}: the reward functions scored no completion for {self.in_a_row} steps in a "
                            f"row ({per_func} at this step): the run learns from nothing, so it stops; make the "
                            f"functions score this data (their columns, rl.answer_column), or set "
                            f"monitor.alerts.unscored_steps: 0 to train on")
        return verdict

    def state_dict(self) -> dict:
        return {"said": self.said, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.said, self.in_a_row = state.get("said", False), state.get("in_a_row", 0)

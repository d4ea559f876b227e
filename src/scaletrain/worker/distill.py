"""train.stage: distill: on-policy distillation (#74; TRL's GKD names, Thinking Machines' on-policy distillation):
the student samples completions of the prompts as GRPO's rollouts do (the same engines, placements and seeds:
worker/grpo.py), the teacher (``rl.teacher_model``, frozen, beside the student on each training device) scores every
sampled position, and the student is trained on the generalized Jensen-Shannon divergence between the two
next-token distributions at each completion token (rl/loss.py ``generalized_jsd``; ``rl.beta`` 1: the reverse KL
of on-policy distillation), its mean over every completion token of the step (all ranks, all micro-batches: 1 and N
workers train the same loss). No reward: the teacher's distribution is the signal.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from scaletrain.rl import loss as rl_loss
from scaletrain.worker.grpo import GRPOObjective
from scaletrain.worker.parallel import all_reduce_sum, unwrap

if TYPE_CHECKING:
    from scaletrain.worker.trainer import Trainer


class DistillObjective(GRPOObjective):
    """worker/objective.py's ``Objective`` for ``train.stage: distill``."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.stats = (*self.stats, "jsd")
        self.teacher = None

    def holds_reference(self, train, lora: bool) -> bool:
        return False

    def prepare(self, t: Trainer, splits: dict, collate) -> dict:
        """The teacher built once on this rank's device, frozen, in the policy's storage precision of frozen
        weights."""
        from scaletrain.config.schema import ModelConfig
        from scaletrain.model.build import build_model

        teacher = build_model(ModelConfig(name_or_path=self.rl.teacher_model, task="causal-lm", finetuning_type="full"),
                              t.spec.vocab, frozen_dtype=t.precision.policy.torch_dtype("frozen"),
                              device=t.ctx.device)
        self.teacher = teacher.to(t.ctx.device).eval().requires_grad_(False)
        return splits

    def _generate(self, t: Trainer, window: list[dict], step: int, rollouts: list[dict] | None = None) -> list[dict]:
        """The window's completions (the student's samples), made the step's batches: no reward, no advantage."""
        rollouts = self._rolled(t, window, step, rollouts)
        out = []
        for r in rollouts:
            r["num_tokens"], r["num_examples"] = r["attention_mask"].sum(), torch.tensor(r["input_ids"].shape[0])
            out.append({k: v for k, v in r.items() if isinstance(v, torch.Tensor)})
        seqs = sum(float(r["completion_mask"].shape[0]) for r in out)
        tokens = sum(float(r["completion_mask"].sum()) for r in out)
        self.totals = rl_loss.Totals(*all_reduce_sum([seqs, tokens], t.ctx.device))
        return out

    def micro_loss(self, t: Trainer, batch: dict, n_micro: int) -> torch.Tensor:
        ids, mask = batch["input_ids"], batch["completion_mask"]
        student = t.model(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False).logits
        t0 = time.perf_counter()
        with torch.no_grad(), t.precision.autocast():
            teacher = self.teacher(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False).logits
        self._add(t, "reference_s", time.perf_counter() - t0)
        s, q = (self._scaled(x, ids, batch["starts"], mask.shape[1]) for x in (student, teacher))
        per_token = rl_loss.generalized_jsd(s, q, self.rl.beta)
        jsd = (per_token * mask).sum()
        with torch.no_grad():
            self._add(t, "jsd", float(jsd))
            self._add(t, "tokens", float(mask.sum()))
        return jsd / max(self.totals.tokens, 1.0) * t.ctx.world_size

    def _scaled(self, logits: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
        """Each completion position's next-token log-probabilities [B, width, V] (fp32, at the sampling
        temperature, as GKD scales both sides), the vocabulary cut to the student's tokenizer."""
        rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
        where = (starts.to(ids.device).unsqueeze(1) + torch.arange(width, device=ids.device)).clamp(
            max=ids.shape[1] - 1)
        picked = logits[rows, where - 1, :len(self.tokenizer)].float() / self.rl.temperature
        return F.log_softmax(picked, dim=-1)

    def evaluate(self, t: Trainer, data, collate) -> dict[str, float]:
        """The held-out prompts answered by the student (step 0's random streams, as GRPO's evaluations), the
        generalized JSD to the teacher over their completion tokens: ``eval/loss``."""
        if len(data) == 0:
            return {}
        self._ensure_tokenizer()
        ctx, g = t.ctx, self.rl.num_generations
        size = max(g, t.cfg.train.per_device_eval_batch_size // g * g)
        batches = [list(range(s, min(s + size, len(data)))) for s in range(0, len(data), size)]
        mine, rounds = batches[ctx.dp_rank::ctx.dp_size], -(-len(batches) // ctx.dp_size)
        policy = unwrap(t.model)
        was_training = policy.training
        policy.eval()
        if self.inflight.pending:
            self.inflight.collect_all(self._engine(t))
        self._sync(t, count=False)
        total = count = 0.0
        for k in range(rounds):
            weight = 1.0 if k < len(mine) else 0.0
            r = self._sample(t, collate([data[i] for i in (mine[k] if k < len(mine) else batches[0])]), 0,
                             count=False)
            ids = r["input_ids"].to(ctx.device)
            mask = r["completion_mask"].to(ctx.device)
            with torch.no_grad(), t.precision.autocast():
                student = t.model(input_ids=ids, attention_mask=r["attention_mask"].to(ctx.device),
                                  use_cache=False).logits
                teacher = self.teacher(input_ids=ids, attention_mask=r["attention_mask"].to(ctx.device),
                                       use_cache=False).logits
            s, q = (self._scaled(x, ids, r["starts"], mask.shape[1]) for x in (student, teacher))
            total += weight * float((rl_loss.generalized_jsd(s, q, self.rl.beta) * mask).sum())
            count += weight * float(mask.sum())
        policy.train(was_training)
        total, count = all_reduce_sum([total, count], ctx.device)
        return {"eval/loss": total / max(count, 1.0), "eval/completion_tokens": count}

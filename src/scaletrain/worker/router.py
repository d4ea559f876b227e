"""The load-balancing loss of a Mixture-of-Experts model, over the global batch.

transformers' ``load_balancing_loss_func`` (Switch Transformer, eqs. 4-6; Qwen-MoE, Mixtral, gpt-oss) is
E x sum_e f_e x P_e, with f_e the share of top-k assignments that go to expert e and P_e its mean router
probability, both pooled over the MoE layers and the tokens of *one forward*. Computed per micro-batch and rank, a
job on N ranks or with accumulation balances each small slice instead of the batch it trains on, and 1 and N
workers optimise different objectives ("Demons in the Detail", Qwen, arXiv:2501.11873, measured the cost of the
per-micro-batch version). Here f is the global batch's: the assignments of every micro-batch of the step on every
rank are counted first (with accumulation, a no-grad forward of the window ahead of the first backward; without,
the same forward's counts, all-reduced before the loss), so the step's auxiliary loss is

    aux = E x sum_e f_e^G x P_e^G,   P_e^G = (sum over the global batch of p_e) / (tokens x layers)

and each micro-batch on each rank contributes E x sum_e f_e^G x (its own sum of p_e) / (tokens x layers),
times the world size (DDP and FSDP average gradients over ranks): the sum is the single-process value on the
concatenated global batch, and so are its gradients (f carries none: it counts arg-top-k choices). The router
z-loss (ST-MoE), where asked, is a per-token mean and is pooled the same way: each micro-batch's sum over its tokens
divided by the global batch's tokens x layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scaletrain.data import model_inputs
from scaletrain.model import context_parallel
from scaletrain.model.moe import Experts
from scaletrain.worker.parallel import all_reduce_sum


def _flat(router_logits, experts: int) -> list[torch.Tensor]:
    return [layer.reshape(-1, experts) for layer in router_logits]


def _mask(batch: dict, rows: int) -> torch.Tensor | None:
    """1 for a real token, 0 for padding, per row of the router's [batch x sequence, E] logits."""
    mask = batch.get("attention_mask")
    return None if mask is None or mask.numel() != rows else mask.reshape(-1).float()


def _chosen(logits: torch.Tensor, experts: Experts) -> torch.Tensor:
    """The experts each token is routed to: top-k of the logits (softmax keeps the order), within the token's best
    groups under DeepSeek-V2's group-limited routing (as its router picks them)."""
    if experts.groups is None:
        return torch.topk(logits, experts.top_k, dim=-1).indices
    groups, keep = experts.groups
    scores = torch.softmax(logits, dim=-1)
    best = scores.view(-1, groups, experts.count // groups).max(dim=-1).values
    allowed = torch.zeros_like(best).scatter_(1, torch.topk(best, keep, dim=-1).indices, 1.0)
    allowed = allowed.repeat_interleave(experts.count // groups, dim=1).bool()
    return torch.topk(scores.masked_fill(~allowed, 0.0), experts.top_k, dim=-1).indices


def assignments(router_logits, batch: dict, experts: Experts) -> tuple[torch.Tensor, float]:
    """(top-k assignments per layer and expert over the real tokens, [layers, E]; tokens x layers)."""
    per_layer = []
    rows = 0.0
    for layer in _flat(router_logits, experts.count):
        chosen = _chosen(layer.detach().float(), experts)
        mask = _mask(batch, layer.shape[0])
        weight = torch.ones_like(chosen, dtype=torch.float32) if mask is None else \
            mask.to(layer.device).unsqueeze(-1).expand_as(chosen)
        per_layer.append(torch.zeros(experts.count, dtype=torch.float32, device=layer.device).scatter_add_(
            0, chosen.reshape(-1), weight.reshape(-1)))
        rows += float(layer.shape[0] if mask is None else mask.sum())
    return torch.stack(per_layer), rows


def probability_sums(router_logits, batch: dict, experts: Experts) -> torch.Tensor:
    """The router probability of each expert summed over the layers and the real tokens (differentiable)."""
    total = None
    for layer in _flat(router_logits, experts.count):
        probs = torch.softmax(layer.float(), dim=-1)
        mask = _mask(batch, layer.shape[0])
        if mask is not None:
            probs = probs * mask.to(layer.device).unsqueeze(-1)
        total = probs.sum(0) if total is None else total + probs.sum(0)
    return total


def z_sums(router_logits, batch: dict, experts: Experts) -> torch.Tensor:
    """The router z-loss's numerator (ST-MoE, Zoph et al. 2022, eq. 5): the squared log-sum-exp of each real token's
    router logits, summed over the layers and tokens (differentiable); divided by the global tokens x layers it is
    the mean the paper defines, over the global batch."""
    total = None
    for layer in _flat(router_logits, experts.count):
        z = torch.logsumexp(layer.float(), dim=-1) ** 2
        mask = _mask(batch, layer.shape[0])
        z = (z if mask is None else z * mask.to(layer.device)).sum()
        total = z if total is None else total + z
    return total


@dataclass
class RouterLoss:
    """The step's global expert shares and each micro-batch's share of the auxiliary loss (see the docstring)."""

    coef: float
    experts: Experts
    world_size: int
    device: str
    z_coef: float = 0.0  # the router z-loss's coefficient (0: not computed)
    shares: torch.Tensor | None = None  # f^G of this step, once counted
    rows: float = 0.0  # tokens x layers of the step's global batch
    # since the last record: the steps' aux values, the steps, the steps' z-loss values
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    layer_counts: torch.Tensor | None = None  # this rank's assignments per layer and expert since a record
    layers: int = 0  # MoE layers (known after the first forward)

    def begin_step(self, model, window: list[dict], autocast) -> None:
        """Count the window's assignments ahead of the first backward when it has more than one micro-batch (a
        no-grad forward of each; all-reduced over ranks); with one, the forward itself counts them."""
        self.shares = None
        if len(window) == 1:
            return
        counts, rows = None, 0.0
        with torch.no_grad(), autocast():
            for batch in window:
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                if "cp_positions" in batch:  # a context-parallel shard: where its positions are in the row
                    context_parallel.set_batch(batch)
                out = model(**model_inputs(batch, labels=False), use_cache=False, output_router_logits=True)
                c, r = assignments(out.router_logits, batch, self.experts)
                counts, rows = (c if counts is None else counts + c), rows + r
        self._share(counts, rows)

    def _share(self, per_layer: torch.Tensor, rows: float) -> None:
        """The step's global shares from this rank's per-layer counts (kept for the router's health record)."""
        self.layer_counts = per_layer if self.layer_counts is None else self.layer_counts + per_layer
        counts = per_layer.sum(0)
        total = all_reduce_sum([*counts.tolist(), rows], self.device)
        self.rows = max(total[-1], 1.0)
        self.shares = torch.tensor(total[:-1], dtype=torch.float32, device=counts.device) / self.rows

    def health_values(self) -> list[float]:
        """This rank's assignments per layer and expert since the last record, flat (for one all-reduce), then
        reset."""
        if self.layer_counts is None:  # no step since the last record: zeros of the same length on every rank
            return [0.0] * self.layers * self.experts.count
        self.layers = self.layer_counts.shape[0]
        values = self.layer_counts.flatten().tolist()
        self.layer_counts = None
        return values

    def micro_loss(self, router_logits, batch: dict) -> torch.Tensor:
        """This micro-batch's share of coef x aux on this rank (x world size: gradients are averaged over ranks);
        its value is added to the step's record."""
        if self.shares is None:  # one micro-batch: this forward's counts are the step's
            counts, rows = assignments(router_logits, batch, self.experts)
            self._share(counts, rows)
        sums = probability_sums(router_logits, batch, self.experts)
        aux = self.experts.count * (self.shares.to(sums.device) * sums).sum() / self.rows
        self.sums[0] += float(aux.detach())  # summed over micro-batches and (at the record) ranks: the step's aux
        loss = self.coef * self.world_size * aux
        if self.z_coef:
            z = z_sums(router_logits, batch, self.experts) / self.rows
            self.sums[2] += float(z.detach())
            loss = loss + self.z_coef * self.world_size * z
        return loss

    def end_step(self) -> None:
        self.sums[1] += 1.0

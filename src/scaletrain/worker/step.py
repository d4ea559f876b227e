"""One optimizer step over an accumulation window of micro-batches.

The loss of a step is the same objective on any number of ranks and micro-batches. Causal LM: the sum of the
token losses of the whole step divided by the number of target tokens of the whole step, across every rank and
micro-batch (one all-reduce of the token count per step, posted before the first forward so it overlaps it).
A mean of per-micro-batch means would weigh a short reply's tokens more than a long one's, and N ranks would
optimise another objective than 1 (transformers#34191, DeepSpeed#5583, LLaMA-Factory#7408). DDP and FSDP
average gradients over ranks, so each rank's loss is its token-loss sum / (global tokens / world size).
Classification keeps the per-sample mean: every micro-batch of every rank holds the same number of samples
(drop_last), so the mean of means is the global mean already.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from scaletrain.data import IGNORE_INDEX, model_inputs
from scaletrain.model import context_parallel
from scaletrain.model.vision import packed_inputs
from scaletrain.worker.breakdown import device_sync, time_without_sync
from scaletrain.worker.faults import delay_s
from scaletrain.worker.loss import chunked_labels
from scaletrain.worker.parallel import all_reduce_async, grad_sync
from scaletrain.worker.trainer import Trainer


def target_tokens(batch: dict) -> int:
    """Tokens a causal LM is trained to predict in a batch (labels shift by one: the first predicts nothing; a
    context-parallel shard's ``shift_labels`` are shifted already)."""
    if "shift_labels" in batch:
        return int((batch["shift_labels"] != IGNORE_INDEX).sum())
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, shifted: bool = False) -> torch.Tensor:
    """Sum of the next-token cross-entropies over the target tokens (fp32, as transformers' own loss)."""
    if not shifted:
        logits, labels = logits[:, :-1], labels[:, 1:]
    logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def labels_of(batch: dict) -> tuple[torch.Tensor, bool]:
    """The batch's labels and whether they are next-token targets already (a context-parallel shard's)."""
    return (batch["shift_labels"], True) if "shift_labels" in batch else (batch["labels"], False)


def _grad_norm(t: Trainer) -> float:
    """The gradients' total L2 norm before clipping (what clip_grad_norm_ returns); clips to max_grad_norm."""
    params = [p for p in t.model.parameters() if p.grad is not None]
    if t.cfg.train.max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, t.cfg.train.max_grad_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor of the shards


def micro_loss(t: Trainer, batch: dict, n_micro: int, tokens_per_rank) -> tuple[torch.Tensor, torch.Tensor]:
    """This micro-batch's share of the step's loss (see the module's docstring), and the part of it recorded as
    train/loss (all of it, but an MoE's auxiliary loss, recorded on its own). ``tokens_per_rank``: a function
    giving the step's target tokens over the world size (waited for on first use), or None for classification."""
    if t.objective is not None:  # e.g. the pairs' mean (worker/preference.py)
        loss = t.objective.micro_loss(t, batch, n_micro)
        # DDP/FSDP average gradients over every rank, and the ranks of a context-parallel group each hold a part
        # of the same pairs' gradient, which must add up: x cp_size (the recorded loss is the pairs' mean)
        return loss * t.ctx.cp_size, loss
    if tokens_per_rank is None:
        loss = t.model(**model_inputs(batch)).loss / n_micro
        return loss, loss
    batch = packed_inputs(batch, t.rope, t.masks_of)  # packed Qwen-VL rows: M-RoPE; Gemma 3's: its masks
    # no cache: with packed rows transformers reads the examples' bounds from position_ids only without one
    routed = {"output_router_logits": True} if t.router is not None else {}
    labels, shifted = labels_of(batch)
    if t.chunked_loss:  # the output layer returns the token-loss sum, chunk by chunk (worker/loss.py)
        with chunked_labels(t.model, labels, shifted):
            out = t.model(**model_inputs(batch, labels=False), use_cache=False, **routed)
        loss = out.logits / tokens_per_rank()
    else:
        out = t.model(**model_inputs(batch, labels=False), use_cache=False, **routed)
        loss = token_loss_sum(out.logits, labels, shifted) / tokens_per_rank()
    if t.router is None:
        return loss, loss
    # the MoE load-balancing loss over the global batch (worker/router.py)
    return loss + t.router.micro_loss(out.router_logits, batch), loss


def shard(t: Trainer, batch: dict) -> dict:
    return context_parallel.shard_batch(batch, t.ctx.cp_size, t.ctx.cp_rank, t.spec.pad_token_id)


def _step_tokens(t: Trainer, window: list[dict]):
    """Post the all-reduce of the step's target tokens now; the returned function waits for it on first use and
    gives tokens / world size (a step without a target token trains nothing: 0 / 1, never 0 / 0)."""
    pending = all_reduce_async([sum(target_tokens(b) for b in window)], t.ctx.device)
    answer: list[float] = []

    def tokens_per_rank() -> float:
        if not answer:
            answer.append(max(pending()[0], 1.0) / t.ctx.world_size)
        return answer[0]

    return tokens_per_rank


def _busy(seconds: float) -> None:
    """Spin for ``seconds``: a slow device keeps its process as busy as more work would; a sleep would read as a
    host that starves the process of CPU (the straggler rule's other cause)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def train_step(t: Trainer, window: list[dict], step: int, poison: bool = False, timing: dict | None = None) -> float:
    """One optimizer step over ``window`` micro-batches; gradients sync on the last one only.

    With ``timing`` (a breakdown probe step) the phases are timed with device syncs in between."""
    strategy, device = t.cfg.train.strategy, t.ctx.device
    loss_sum = 0.0
    started = time.perf_counter()
    if slow := delay_s(t.spec.faults, t.ctx.world_rank, step):  # fault injection: a straggler's slow device
        _busy(slow)
    if pause := delay_s(t.spec.faults, t.ctx.world_rank, step, "pause"):  # fault injection: a longer run
        time.sleep(pause)
    if t.objective is not None:  # GRPO: the prompts answered and rewarded (worker/grpo.py)
        t.beat.enter("rollout", step)
        window[:] = t.objective.begin_step(t, window, step)
    token_mean = t.cfg.model.task == "causal-lm" and t.cfg.train.stage == "sft"
    if t.ctx.cp_size > 1:  # this rank's share of every sequence (labels shifted before the split)
        window = [shard(t, b) for b in window]
    tokens_per_rank = _step_tokens(t, window) if token_mean else None
    if t.router is not None:
        t.router.begin_step(t.model, window, t.precision.autocast)
    if timing is not None:
        if t.ctx.world_size > 1:  # one worker has no gradient sync to expose
            timing["compute_s"] = time_without_sync(t.model, window, strategy, device, t.precision, t.optimizer)
            timing["probe_s"] = timing["compute_s"]  # extra work of this probe: kept out of throughput
        t0 = time.perf_counter()
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if t.ctx.cp_size > 1:
            context_parallel.set_batch(batch)
        # FSDP all-gathers parameters in forward, so there forward is a collective phase.
        t.beat.enter("forward-gather" if strategy == "fsdp" else "forward", step)
        with grad_sync(t.model, strategy, enabled=last), t.precision.autocast():
            loss, logged = micro_loss(t, batch, len(window), tokens_per_rank)
        if poison:  # fault injection: a NaN loss, as a diverging run produces
            loss, logged = loss * float("nan"), logged * float("nan")
        if last:
            t.beat.enter("sync", step)  # backward of the last micro-batch all-reduces gradients
            t.ready_s = time.perf_counter() - started  # this rank's own work before it waits for the others
        t.precision.backward(loss)
        # Causal LM: this rank's token-loss sum x world size / the step's tokens; the meter's mean over ranks
        # of it is the step's token mean (an MoE's auxiliary loss is recorded on its own). Classification: the
        # rank's mean, as before.
        loss_sum += logged.item()
    if timing is not None:
        device_sync(device)
        timing["fwd_bwd_sync_s"] = time.perf_counter() - t0
        timing.setdefault("compute_s", timing["fwd_bwd_sync_s"])
        t0 = time.perf_counter()
    if t.router is not None:
        t.router.end_step()
    t.beat.enter("optimizer", step)
    t.precision.unscale(t.optimizer)
    t.grad_norm = _grad_norm(t)
    t.precision.step(t.optimizer)
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    if timing is not None:
        device_sync(device)
        timing["optimizer_s"] = time.perf_counter() - t0
    return loss_sum

"""The optimizer and its LR schedule (the batch and step arithmetic they use: config/batch.py)."""

from __future__ import annotations

from scaletrain.config.batch import warmup_steps
from scaletrain.config.schema import TrainConfig

FUSED_DEVICES = ("cpu", "cuda")  # device types torch's fused AdamW runs on (ROCm is "cuda")


def build_optimizer(model, train: TrainConfig, lr: float, total: int):
    import torch
    from transformers import get_scheduler

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # torch's fused AdamW kernel (CPU and CUDA/ROCm, as torchtitan's default): one MiniLM step (22.7M parameters,
    # 1 CPU thread) takes 16 ms against 113 ms for the per-parameter loop and 96 ms for foreach.
    fused = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for g in groups for p in g["params"])
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(train.adam_beta1, train.adam_beta2),
                                  **({"fused": True} if fused else {"foreach": False}))
    scheduler = get_scheduler(train.lr_scheduler_type, optimizer,
                              num_warmup_steps=warmup_steps(train, total), num_training_steps=total)
    return optimizer, scheduler

"""The precision policy at run time (model/precision.py decides it): autocast, the grad scaler, the dtypes."""

from __future__ import annotations

import contextlib

import torch

from scaletrain.config.schema import Config
from scaletrain.model.precision import Policy, policy


def device_policy(cfg: Config, device: str) -> Policy:
    """The policy for this worker's device (a GPU's bf16/fp16 support asked of torch)."""
    on_gpu = device.startswith("cuda")
    bf16_ok = bool(on_gpu and torch.cuda.is_bf16_supported())
    t = cfg.train
    return policy("gpu" if on_gpu else "cpu", t.bf16, t.fp16, cfg.model.torch_dtype, t.strategy,
                  bf16_supported=bf16_ok or not on_gpu)


class Precision:
    """Autocast in the policy's compute dtype (fp16 with a grad scaler); nothing in fp32."""

    def __init__(self, cfg: Config, device: str):
        self.policy = device_policy(cfg, device)
        self.device_type = "cuda" if device.startswith("cuda") else "cpu"
        half = self.policy.compute != "fp32"
        # under FSDP the mixed-precision policy casts the parameters; autocast still covers what FSDP does not
        # own (the loss's own ops), as torchtitan does
        self.dtype = self.policy.torch_dtype("compute") if half else None
        self.scaler = torch.amp.GradScaler("cuda") if self.policy.scaler else None
        self.dtype_name = self.policy.compute
        self.note = self.policy.note

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss):
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer):
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer):
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

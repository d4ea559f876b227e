"""Mixed precision: bf16/fp16 autocast where the device supports it (fp16 with a grad scaler); fp32 on CPU."""

from __future__ import annotations

import contextlib

import torch

from scaletrain.config.schema import Config


class Precision:
    """bf16/fp16 autocast where the device supports it; fp32 on CPU with a note."""

    def __init__(self, cfg: Config, device: str):
        on_gpu = device.startswith("cuda")
        wanted = "bf16" if cfg.train.bf16 else "fp16" if cfg.train.fp16 else None
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(wanted) if on_gpu else None
        self.device_type = "cuda" if on_gpu else "cpu"
        self.scaler = torch.amp.GradScaler("cuda") if on_gpu and wanted == "fp16" else None
        self.dtype_name = wanted if self.dtype is not None else "fp32"
        if wanted and not on_gpu:
            self.note = f"{wanted} requested but training on CPU: using fp32"
        else:
            self.note = f"precision {wanted or 'fp32'}"

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

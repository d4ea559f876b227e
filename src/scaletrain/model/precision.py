"""The precision policy, owned here: what is stored in which dtype and what computes in which.

One pure function of the device, ``train.bf16/fp16``, ``model.torch_dtype``, the strategy and the fine-tuning
type, used by the worker (building and wrapping the model, autocast), the memory plan (bytes per parameter) and
the driver (the table in main.log and summary.json), so the plan and the run cannot disagree. The rules are the
ones mixed-precision training needs (and what LLaMA-Factory, TRL and torchtitan do):

- trainable parameters are fp32 master weights whatever the checkpoint's dtype (a bf16 checkpoint is upcast on
  load): updates smaller than bf16's resolution (lr 1e-5 on weights of ~1e-2) would otherwise be lost; the
  optimizer states are fp32; gradients are reduced in fp32;
- frozen weights (a LoRA base, frozen modules) are stored in the compute dtype on GPUs, never upcast there;
- compute is bf16/fp16 by autocast under DDP, by FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32)``
  under FSDP; fp16 adds a grad scaler;
- on CPU everything is fp32 unless ``model.torch_dtype: bfloat16`` with ``train.bf16: true`` opts in to the GPU
  policy with CPU bf16 autocast (how the tests exercise the mixed path end to end).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError
from scaletrain.model.dtypes import TORCH_NAMES, torch_dtype, torch_name


@dataclass(frozen=True)
class Policy:
    compute: str  # the dtype matmuls run in: bf16, fp16 or fp32
    frozen: str  # storage of weights that do not train
    how: str  # "autocast", "fsdp mixed precision" or "none"
    scaler: bool  # fp16: a gradient scaler
    note: str  # one line for the console and main.log
    master: str = "fp32"  # trainable parameters (LoRA adapters included)
    optimizer: str = "fp32"
    reduce: str = "fp32"  # gradients as they are reduced

    def table(self) -> dict[str, str]:
        """summary.json's precision record (and main.log's table): what is held, and computes, in which dtype."""
        return {"precision/compute": self.compute, "precision/trainable_params": self.master,
                "precision/frozen_params": self.frozen, "precision/optimizer_states": self.optimizer,
                "precision/grad_reduce": self.reduce, "precision/mixed_by": self.how}

    def torch_dtype(self, which: str):
        return torch_dtype(getattr(self, which))


def policy(device: str, bf16: bool, fp16: bool, torch_dtype: str = "auto", strategy: str = "ddp",
           bf16_supported: bool = True, fp16_supported: bool = True) -> Policy:
    """``device``: "cpu" or "gpu"; ``torch_dtype``: ``model.torch_dtype`` (the storage of frozen weights)."""
    wanted = "bf16" if bf16 else "fp16" if fp16 else None
    stored = TORCH_NAMES.get(torch_dtype)  # None: auto
    if stored in ("bf16", "fp16") and wanted and stored != wanted:
        raise ConfigError(f"model.torch_dtype={torch_dtype} and train.{wanted}=true disagree (frozen weights in "
                          f"{stored}, compute in {wanted}); set model.torch_dtype={torch_name(wanted)} or auto")
    if stored in ("bf16", "fp16") and not wanted and not (device == "cpu"):
        raise ConfigError(f"model.torch_dtype={torch_dtype} needs train.{stored}=true (weights stored in {stored} "
                          f"compute in {stored}); set it, or model.torch_dtype=auto for fp32")
    how = "fsdp mixed precision" if strategy == "fsdp" else "autocast"
    if device == "cpu":
        if wanted == "bf16" and stored == "bf16":
            return Policy("bf16", "bf16", how, False, "precision bf16 on CPU (model.torch_dtype=bfloat16 opts in): "
                          "frozen weights bf16, trainable fp32 master weights, bf16 autocast")
        if stored in ("bf16", "fp16"):
            raise ConfigError(f"model.torch_dtype={torch_dtype} on CPU needs train.bf16=true (bf16 only: CPU "
                              f"autocast in fp16 is not supported here); set both, or model.torch_dtype=auto")
        note = (f"{wanted} requested but training on CPU: fp32 everywhere (a bf16/fp16 checkpoint is upcast on "
                f"load; model.torch_dtype=bfloat16 with train.bf16=true opts in to bf16 autocast)" if wanted
                else "precision fp32 (CPU)")
        return Policy("fp32", "fp32", "none", False, note)
    if wanted == "bf16" and not bf16_supported:
        raise ConfigError("train.bf16=true but this GPU has no bf16 support; set train.fp16=true instead (or "
                          "neither, for fp32)")
    if wanted == "fp16" and not fp16_supported:
        raise ConfigError("train.fp16=true but this device has no fp16 support; set train.fp16=false")
    if wanted is None:
        return Policy("fp32", "fp32", "none", False, "precision fp32")
    frozen = "fp32" if stored == "fp32" else wanted
    return Policy(wanted, frozen, how, wanted == "fp16",
                  f"precision {wanted}: trainable fp32 master weights, frozen weights {frozen}, {wanted} compute by "
                  f"{how}, fp32 optimizer states and gradient reduction" + ("; grad scaler" if wanted == "fp16"
                                                                           else ""))

"""Data-parallel wrapping (DDP or FSDP2 ``fully_shard``) and the few operations that differ between them."""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.comm.context import DistContext
from scaletrain.config.schema import TrainConfig
from scaletrain.model.build import enable_checkpointing, transformer_blocks
from scaletrain.model.precision import Policy
from scaletrain.model.quantize import is_nf4


def wrap_model(model: nn.Module, ctx: DistContext, train: TrainConfig, precision: Policy | None = None) -> nn.Module:
    if train.gradient_checkpointing:
        enable_checkpointing(model)  # before fully_shard: FSDP2 then shards the checkpointed blocks
    strategy = train.strategy
    if not (strategy == "fsdp" and train.fsdp_offload and ctx.device != "cpu"):
        model.to(ctx.device)  # offloaded parameters stay on the host; FSDP moves each block in for its compute
    if ctx.world_size == 1 and strategy == "ddp":
        return model  # nothing to synchronise; keeps the 1-worker baseline free of DDP overhead
    if ctx.world_size == 1 and any(is_nf4(p) for p in model.parameters()):
        # nothing to shard, and torch 2.13's one-rank FSDP path copies only the first of a tensor subclass's
        # inner tensors (an NF4 weight has three): the QLoRA base stays whole, autocast computes as under FSDP
        return model
    if strategy == "ddp":
        ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
        # a QLoRA base's NF4 weights are not broadcast from rank 0: every rank quantized the same bytes, and DDP's
        # broadcast of a tensor subclass hands the other ranks something else (their first loss differed)
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [name for name, p in model.named_parameters() if is_nf4(p)])
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **no_forward_buffer_sync())
    from torch.distributed.fsdp import fully_shard

    kwargs = {"mesh": device_mesh(ctx, train.fsdp_shard_size), **fsdp_policies(train, ctx.device, precision)}
    # Shard each transformer block separately so only one block is gathered at a time, then the rest.
    for block in transformer_blocks(model):
        fully_shard(block, reshard_after_forward=train.fsdp_reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)  # the root: kept gathered after forward (backward needs it first)
    return model


def device_mesh(ctx: DistContext, shard_size: int | None):
    """1-D (shard over every rank) or, with ``shard_size`` < world size, 2-D: replicate across groups of
    ``shard_size`` ranks, shard inside each (hybrid sharding, FSDP2's HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = torch.device(ctx.device).type
    if not shard_size or shard_size >= ctx.world_size:
        return init_device_mesh(kind, (ctx.world_size,))
    return init_device_mesh(kind, (ctx.world_size // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def context_parallel_group(ctx: DistContext, method: str):
    """This rank's context-parallel group: the ``cp`` dimension of a (dp, cp) device mesh, whose consecutive
    ranks share a batch (DistContext.dp_rank / cp_rank). FSDP shards over every rank (both dimensions)."""
    from torch.distributed.device_mesh import init_device_mesh

    from scaletrain.model.context_parallel import Group

    mesh = init_device_mesh(torch.device(ctx.device).type, (ctx.dp_size, ctx.cp_size), mesh_dim_names=("dp", "cp"))
    return Group(ctx.cp_size, ctx.cp_rank, mesh["cp"].get_group(), method)


def fsdp_policies(train: TrainConfig, device: str, precision: Policy | None = None) -> dict:
    """FSDP2 mixed precision as the precision policy says (parameters gathered in its compute dtype, gradients
    reduced in fp32; the sharded master weights and the optimizer state stay fp32) and host offload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    out = {}
    if precision is not None and precision.compute != "fp32":
        out["mp_policy"] = MixedPrecisionPolicy(param_dtype=precision.torch_dtype("compute"),
                                                reduce_dtype=torch.float32)
    if train.fsdp_offload and device != "cpu":  # on CPU workers the device is the host already (job.py says so)
        out["offload_policy"] = CPUOffloadPolicy()
    return out


def no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's switch for the buffer broadcast before every forward, off.

    HF models' buffers (position ids) never change: broadcasting them each forward is a wasted collective,
    and it would make forward a sync point (a stuck rank would look like a forward hang). torch 2.13 renamed
    the switch ``forward_sync_buffers`` and warns on ``broadcast_buffers``, which older builds (the ROCm and
    CUDA torch users bring) still need.
    """
    params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}


def grad_sync(model: nn.Module, strategy: str, enabled: bool):
    """Context for one micro-batch: skip the gradient all-reduce/reduce-scatter unless ``enabled``.

    Non-final micro-batches of an accumulation window only accumulate locally.
    """
    if strategy == "fsdp" and hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if isinstance(model, nn.parallel.DistributedDataParallel) and not enabled:
        return model.no_sync()
    return contextlib.nullcontext()


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def full_model_state(model: nn.Module, trainable_only: bool) -> dict:
    """The unsharded state dict on the CPU, for rank 0 (a collective under FSDP: call on all ranks).

    With ``cpu_offload`` and several ranks, torch gives the full tensors to rank 0 only; the others get an
    empty dict, so only rank 0 may write what this returns."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # get_model_state_dict strips the DDP "module." prefix and gathers FSDP shards.
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    return get_model_state_dict(model, options=opts)


def all_reduce_sum(values: list[float], device: str) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_max_async(values: list[float], device: str):
    """Start an element-wise MAX over ranks of ``values``; returns a function that waits and gives the result."""
    return all_reduce_async(values, device, dist.ReduceOp.MAX if dist.is_available() else None)


def all_reduce_async(values: list[float], device: str, op=None):
    """Start an element-wise reduction (SUM by default) over ranks; returns a function that waits for the result."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    work = None
    if dist.is_available() and dist.is_initialized():
        work = dist.all_reduce(t, op=op if op is not None else dist.ReduceOp.SUM, async_op=True)

    def result() -> list[float]:
        if work is not None:
            work.wait()
        return t.tolist()

    return result


def all_gather_floats(values: list[float], device: str) -> list[list[float]]:
    """Every rank's ``values``, indexed by rank (a single rank without a process group: just its own)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if not (dist.is_available() and dist.is_initialized()):
        return [t.tolist()]
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]

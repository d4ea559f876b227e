"""``final/``: the run's model as a transformers (or peft adapter) directory, loadable with from_pretrained.

A full model is written in the dtype its checkpoint came in (an adapter as peft saves it, fp32). Two ways:

- **every rank writes** (a full fine-tune sharded by FSDP over several ranks whose run directory is one
  filesystem for all, a model whose checkpoint keys are its parameter names): each rank writes its own shards of
  every tensor with DCP's Hugging Face writer, then each rank assembles a share of the output safetensors files
  from them (torch's ``consolidate_safetensors_files_on_every_rank``), so no rank ever holds the whole model: a
  rank's peak growth is its cast shards plus one piece of an output file, about 1/N of the model x 1.25
  (measured in tests/loop/test_final_every_rank.py). The index, config.json and
  generation_config.json are rank 0's to write; the per-rank pieces are removed after.
- **rank 0 writes** the gathered state dict with ``save_pretrained`` otherwise (one rank, DDP, LoRA adapters, a run
  on object storage, and models whose checkpoint stores tensors differently from the model: transformers 5 fuses
  Qwen3-MoE's and Mixtral's experts at load and ``save_pretrained`` splits them back).
"""

from __future__ import annotations

import math
import shutil

import torch.distributed as dist

from scaletrain.model.dtypes import torch_dtype
from scaletrain.model.files import final_dtype, set_config_dtype
from scaletrain.rundir import RunDir
from scaletrain.storage.mirror import upload_tree
from scaletrain.storage.uri import Store
from scaletrain.worker.parallel import full_model_state, unwrap
from scaletrain.worker.trainer import Trainer

SHARD_BYTES = 5 * 2**30  # the largest output file written by every rank (transformers' default shard size)
FILES_PER_RANK = 4  # output files per rank at least (file_of_each)
_SHARDED = "sharded"  # DCP's per-rank pieces, under final/ while it is written


def save_final(t: Trainer) -> str:
    """Write ``final/`` (see the module docstring); a collective: every rank calls it. Returns the dtype."""
    dtype = final_dtype(t.cfg.model, t.precision.policy.compute) if not t.lora else "fp32"
    if _every_rank_writes(t):
        _save_sharded(t, dtype)
    else:
        _save_gathered(t, dtype)
    if t.spec.store and t.ctx.is_main:  # a run on object storage: final/ goes there (the driver adds the tokenizer)
        upload_tree(t.run_dir.final, Store(t.spec.store, t.cfg.storage.endpoint_url).child(RunDir.FINAL))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return dtype


def _every_rank_writes(t: Trainer) -> bool:
    """Every rank writes into ``final/`` and reads the others' pieces there: the run directory must be one
    filesystem for all of them (the local or shared run directory; a run on object storage has a mirror per node,
    so rank 0 writes and uploads)."""
    if t.lora or t.cfg.train.strategy != "fsdp" or t.ctx.world_size < 2 or t.spec.store:
        return False
    from transformers.conversion_mapping import get_model_conversion_mapping

    return not get_model_conversion_mapping(unwrap(t.model), add_legacy=False)


def _save_gathered(t: Trainer, dtype: str) -> None:
    state = full_model_state(t.model, trainable_only=False)  # collective under FSDP; rank 0 gets the tensors
    if t.ctx.is_main:
        model = unwrap(t.model)
        if not t.lora:
            target = torch_dtype(dtype)
            state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
        model.save_pretrained(str(t.run_dir.final), state_dict=state, safe_serialization=True)
        if not t.lora:  # transformers writes the dtype of the (fp32 master) model it saves from
            set_config_dtype(t.run_dir.final, dtype)


def file_of_each(state: dict, world_size: int) -> dict[str, int]:
    """Tensor name -> output file (1-based), in order, files of about equal bytes: FILES_PER_RANK per rank (each
    rank assembles whole files), none much over SHARD_BYTES. DCP's writer builds each piece (a rank's part of one
    output file) in memory before writing it, so a rank's peak while saving is its cast shards plus one piece:
    1/N of the model x (1 + 1/FILES_PER_RANK)."""
    sizes = {k: v.numel() * v.element_size() for k, v in state.items()}
    total = sum(sizes.values())
    files = min(len(sizes), max(FILES_PER_RANK * world_size, math.ceil(total / SHARD_BYTES)))
    per_file, out, used, index = total / files, {}, 0, 1
    for key, size in sizes.items():
        if used and used + size / 2 > per_file * index and index < files:
            index += 1
        out[key] = index
        used += size
    return out


def _save_sharded(t: Trainer, dtype: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files_on_every_rank
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = unwrap(t.model)
    sharded = get_model_state_dict(t.model, options=StateDictOptions())  # DTensors: each rank its own shards
    # A tied weight (lm_head = embed_tokens) is one parameter under two names: written once, under its first
    # name, as save_pretrained does.
    first: dict[int, str] = {}
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), name) != name}
    target = torch_dtype(dtype)
    state = {key: value.to(target) if value.is_floating_point() else value
             for key, value in sharded.items() if key not in tied}
    final = t.run_dir.final
    pieces = final / _SHARDED
    mapping = file_of_each(state, t.ctx.world_size)
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(path=str(pieces), save_distributed=True,
                                                            fqn_to_index_mapping=mapping))
    del state, sharded  # this rank's cast shards, before it assembles its output files: the peak is one or other
    consolidate_safetensors_files_on_every_rank(str(pieces), str(final), mapping)
    dist.barrier()
    if t.ctx.is_main:
        shutil.rmtree(pieces)
        model.config.save_pretrained(str(final))
        if getattr(model, "generation_config", None) is not None and model.can_generate():
            model.generation_config.save_pretrained(str(final))
        set_config_dtype(final, dtype)

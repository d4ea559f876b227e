"""A 4-bit base for LoRA (QLoRA): the decoder blocks' linear weights stored as NF4, frozen, LoRA on top.

Two engines, one format. ``torchao`` (CPU and GPU; what the tests run): every linear layer inside the transformer
blocks gets its weight replaced by torchao's ``NF4Tensor`` (64-value blocks, their scales quantized again in blocks
of 256: QLoRA's double quantization), and its forward by torchao's ``linear_nf4`` (dequantize to the input's dtype,
then matmul; autograd reaches the input, never the weight). This is torchtune's QLoRA: the tensor subclass shards
under FSDP2 (``fully_shard`` gathers the 4-bit bytes, not bf16) and DDP skips it (it is frozen). ``bnb``
(bitsandbytes, CUDA and ROCm): transformers loads the checkpoint with a ``BitsAndBytesConfig``, as LLaMA-Factory
does (``bnb_kwargs``).

Embeddings, the output layer and norms stay in their storage dtype (as in QLoRA, torchtune and bitsandbytes): they
are a small part of a large model and the output layer's precision weighs on the loss. A block's weight whose size
is not a multiple of one NF4 scale group (64 x 256 values) stays unquantized, and the start-of-run line counts it.
The weights are quantized from bf16 (the checkpoints' own dtype), so every rank and every restart quantizes the
same bytes: a LoRA checkpoint holds only the adapter, and a resume rebuilds the same base.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from scaletrain.config.schema import ModelConfig
from scaletrain.errors import ConfigError

BLOCK = 64  # values per NF4 block (one int8 scale each)
SCALER_BLOCK = 256  # scales per second-level block (one fp32 factor each): the double quantization
GROUP = BLOCK * SCALER_BLOCK  # a quantized weight's size must be a multiple of this
# Bytes per NF4 parameter: 4 bits, an int8 scale per block, an fp32 factor per group of scales.
NF4_BYTES = 0.5 + 1 / BLOCK + 4 / GROUP


# Pre-quantized checkpoints' quant_method (config.json) -> (the module transformers needs, its pip name).
PREQUANTIZED = {"gptq": ("gptqmodel", "gptqmodel"), "awq": ("gptqmodel", "gptqmodel"), "aqlm": ("aqlm", "aqlm"),
                "bitsandbytes": ("bitsandbytes", "bitsandbytes"), "hqq": ("hqq", "hqq"), "eetq": ("eetq", "eetq"),
                "compressed-tensors": ("compressed_tensors", "compressed-tensors"),
                "torchao": ("torchao", "torchao")}


def bytes_per_param(bits: int, double: bool = True) -> float:
    """Storage of one quantized weight: NF4 (torchao's, or bitsandbytes' with double quantization) as NF4_BYTES;
    bitsandbytes' 4-bit without it keeps an fp32 scale per 64 values; 8-bit (LLM.int8) one byte (its per-row
    scales are a rounding error)."""
    if bits == 8:
        return 1.0
    return NF4_BYTES if double else 0.5 + 4 / BLOCK


@dataclass(frozen=True)
class Quantized:
    """What a 4-bit base holds: the linear weights made NF4 and the ones kept (with why)."""

    engine: str
    layers: int  # linear layers quantized
    params: int  # their parameters
    kept: tuple[str, ...] = ()  # block linear layers left unquantized (size not a multiple of GROUP)

    def note(self) -> str:
        kept = (f"; {len(self.kept)} kept in their dtype (size not a multiple of {GROUP} values: "
                f"{', '.join(self.kept[:3])}{', ...' if len(self.kept) > 3 else ''})" if self.kept else "")
        return (f"qlora: {self.layers} linear layers of the decoder blocks in NF4 via {self.engine} "
                f"({self.params:,} parameters at {NF4_BYTES:.3f} bytes each, double-quantized scales, frozen); "
                f"embeddings, output layer and norms in their dtype{kept}")


def block_linears(model, blocks: list) -> list[tuple[str, object]]:
    """The linear layers inside the transformer ``blocks`` (model.build.transformer_blocks), with their names: what
    a 4-bit base quantizes (also on the meta device, for the memory plan)."""
    import torch.nn as nn

    blocks = {id(b) for b in blocks}
    out = []
    for name, module in model.named_modules():
        if id(module) in blocks:
            out.extend((f"{name}.{sub}", m) for sub, m in module.named_modules() if type(m) is nn.Linear)
    return out


def quantizable(weight) -> bool:
    return weight.numel() % GROUP == 0


def engine_for(model: ModelConfig, gpu: bool) -> str:
    """The engine that quantizes this run's base on this device kind ("torchao" or "bnb"); ``auto``: bitsandbytes on
    a GPU where it is installed, else torchao. One line where the asked combination cannot run here (said before
    any worker starts)."""
    bits, method = model.quantization_bit, model.quantization_method
    bnb = importlib.util.find_spec("bitsandbytes") is not None
    if method == "auto":
        method = "bnb" if gpu and (bnb or bits == 8) else "torchao"
    if method == "bnb":
        if not gpu:
            raise ConfigError(f"model.quantization_bit={bits} with bitsandbytes: its kernels need a CUDA or ROCm GPU "
                              f"(this run is on CPU); set model.quantization_bit: 4 with model.quantization_method: "
                              f"torchao (NF4, the same format)")
        if not bnb:
            raise ConfigError("model.quantization_method=bnb: bitsandbytes is not installed; pip install "
                              "bitsandbytes (CUDA, or ROCm 6.1+ on Instinct), or set model.quantization_method: "
                              "torchao")
        return "bnb"
    why = ("8-bit (LLM.int8) is bitsandbytes' (GPUs): set model.quantization_method: bnb, or quantization_bit: 4"
           if bits == 8 else "fp4 is bitsandbytes' format: set model.quantization_type: nf4, or "
           "model.quantization_method: bnb on a GPU" if model.quantization_type == "fp4" else
           "its NF4 always quantizes the scales again: remove model.double_quantization: false, or set "
           "model.quantization_method: bnb on a GPU" if not model.double_quantization else
           "peft's DoRA reads the base weight as a plain tensor, not torchao's NF4: set model.use_dora: false, or "
           "model.quantization_method: bnb on a GPU (QDoRA)" if model.use_dora else None)
    if why:
        raise ConfigError(f"model.quantization_bit={bits} with torchao: {why}")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError("model.quantization_bit=4 with torchao: torchao is not installed; pip install "
                          "'scaletrain[quant]', or set model.quantization_method: bnb on a GPU")
    return "torchao"


def shard_error(linears: list[tuple[str, object]], world_size: int) -> str | None:
    """Why FSDP2 cannot shard this NF4 base over ``world_size`` ranks, or None: torchao shards an NF4 weight by its
    rows and its scale groups, both of which must divide evenly (shapes only: also on the meta device)."""
    for name, module in linears:
        w = module.weight
        if not quantizable(w):
            continue
        groups = w.numel() // GROUP
        if w.shape[0] % world_size or groups % world_size:
            return (f"{name}: {w.shape[0]} rows and {groups} NF4 scale groups do not divide over {world_size} "
                    f"ranks; set train.strategy: ddp, or a worker count that divides them")
    return None


def bnb_kwargs(bits: int, quant_type: str, double: bool, compute_dtype) -> dict:
    """transformers' ``from_pretrained`` arguments for a bitsandbytes base (LLaMA-Factory's mapping of the same
    keys): 4-bit NF4/FP4 with optional double quantization, or 8-bit LLM.int8."""
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}
    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=double,
        bnb_4bit_compute_dtype=compute_dtype, bnb_4bit_quant_storage=compute_dtype)}


def quantize_nf4(model, blocks: list) -> Quantized:
    """Replace the linear weights of the transformer ``blocks`` by frozen NF4 tensors (torchao), in place; before
    LoRA is applied (peft then wraps these layers as it wraps any nn.Linear)."""
    linears = block_linears(model, blocks)
    kept = tuple(name for name, m in linears if not quantizable(m.weight))
    params = 0
    for name, module in linears:
        if name in kept:
            continue
        params += module.weight.numel()
        _to_nf4_linear(module)
    if not params:
        raise ConfigError(f"model.quantization_bit=4: no linear weight of the decoder blocks is a multiple of {GROUP} "
                          f"values ({len(linears)} layers, e.g. {linears[0][0] if linears else 'none'}); NF4 cannot "
                          f"quantize this model: remove model.quantization_bit")
    return Quantized("torchao", len(linears) - len(kept), params, kept)


def _nf4_forward(self, x):
    """The forward of a linear layer whose weight is an NF4Tensor: torchao's ``linear_nf4`` (autograd to the input
    only: the weight is frozen), plus the bias."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4

    out = linear_nf4(x, self.weight)
    return out + self.bias.to(out.dtype) if self.bias is not None else out


def _to_nf4_linear(module) -> None:
    import torch
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    weight = module.weight.detach().to(torch.bfloat16)
    module.weight = torch.nn.Parameter(to_nf4(weight, BLOCK, SCALER_BLOCK), requires_grad=False)
    module.__class__ = _nf4_class(type(module))


_CLASSES: dict[type, type] = {}


def _nf4_class(base: type) -> type:
    """An ``nn.Linear`` subclass whose forward runs on the NF4 weight: still an ``nn.Linear`` to peft (which wraps
    it as a LoRA base layer) and to the block's code."""
    if base not in _CLASSES:
        _CLASSES[base] = type(f"NF4{base.__name__}", (base,), {"forward": _nf4_forward})
    return _CLASSES[base]


def is_nf4(tensor) -> bool:
    """Whether a parameter holds an NF4 weight (its storage is not a plain tensor: never cast or upcast it)."""
    data = getattr(tensor, "data", tensor)
    return type(data).__name__ == "NF4Tensor"


def prequantized_error(path) -> str | None:
    """Why a pre-quantized checkpoint (config.json ``quantization_config``: GPTQ, AWQ, ...) cannot load here, or
    None: transformers loads it when the method's package is installed."""
    import importlib.util
    import json

    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    method = (config.get("quantization_config") or {}).get("quant_method")
    if not method:
        return None
    package = PREQUANTIZED.get(method)
    if package is None:
        return f"its quantization_config names quant_method {method}, which scaletrain does not load"
    if importlib.util.find_spec(package[0]) is None:
        return (f"a {method} checkpoint (config.json quantization_config); transformers loads it with {package[1]}, "
                f"which is not installed: pip install {package[1]}, or train on the original-precision model")
    return None

"""What a LoRA run's frozen base is stored and computed in, said before any worker starts: a QLoRA base's engine
on the job's device kind and the layers it quantizes (FSDP2's even split checked), or the FP8 base's layers; the
refusals where the device cannot. Read on a meta-device copy of the model (no weights)."""

from __future__ import annotations

from scaletrain.config.schema import ModelConfig
from scaletrain.errors import ConfigError
from scaletrain.model.build import auto_and_config, transformer_blocks
from scaletrain.model.quantize import GROUP, Quantized, block_linears, engine_for, quantizable, shard_error
from scaletrain.model.tokenizer import Vocab


def quantization_note(cfg: ModelConfig, vocab: Vocab, gpu: bool, strategy: str, world_size: int) -> str | None:
    """What a QLoRA base will hold, said at start (and its errors before any worker starts): the engine on this
    device kind, the layers quantized and kept, FSDP2's even split of the NF4 weights (on a meta-device copy)."""
    import torch

    if cfg.fp8_base:
        return _fp8_note(cfg, vocab, gpu)
    if not cfg.quantization_bit:
        return None
    engine = engine_for(cfg, gpu)
    if engine == "bnb":
        what = ("8-bit (LLM.int8)" if cfg.quantization_bit == 8 else
                f"4-bit {cfg.quantization_type}" + (", double-quantized scales" if cfg.double_quantization else ""))
        return f"qlora: the base loaded {what} by bitsandbytes, frozen; LoRA on top"
    auto, config = auto_and_config(cfg, vocab)
    with torch.device("meta"):
        model = auto.from_config(config)
    linears = block_linears(model, transformer_blocks(model))
    kept = tuple(name for name, m in linears if not quantizable(m.weight))
    params = sum(m.weight.numel() for name, m in linears if name not in kept)
    if not params:
        raise ConfigError(f"model.quantization_bit=4: no linear weight in the decoder blocks of {cfg.name_or_path} "
                          f"is NF4-sized (a multiple of {GROUP} values); remove model.quantization_bit")
    if strategy == "fsdp" and world_size > 1 and (why := shard_error(linears, world_size)):
        raise ConfigError(f"model.quantization_bit=4 under FSDP2: {why}")
    return Quantized("torchao", len(linears) - len(kept), params, kept).note()


def _fp8_note(cfg: ModelConfig, vocab: Vocab, gpu: bool) -> str:
    """model.fp8_base's start line, or its one-line refusal on a CPU job (a GPU's own FP8 is checked by the worker
    on its device)."""
    import torch

    from scaletrain.model.fp8 import convertible, fp8_device_error, note

    if not gpu:
        raise ConfigError(f"model.fp8_base: {fp8_device_error('cpu')}; remove model.fp8_base, or run on GPUs with "
                          f"FP8 (H100/H200/B200, L40S, MI300X/MI325X/MI355X)")
    auto, config = auto_and_config(cfg, vocab)
    with torch.device("meta"):
        model = auto.from_config(config)
    linears = block_linears(model, transformer_blocks(model))
    return note(sum(convertible(m) for _, m in linears), tuple(n for n, m in linears if not convertible(m)))

"""FP8 matmuls for LoRA's frozen base (``model.fp8_base``): the decoder blocks' linear layers through torchao's
``Float8Linear`` before LoRA wraps them (the order that sped a 70B LoRA up 1.30x in torchtune#2833: base -> FP8,
then LoRA; LoRA's own small matmuls stay in the compute dtype).

Float8Linear casts its input and weight to float8 (e4m3, one scale per tensor, dynamic) for every matmul and runs
``torch._scaled_mm``: the forward and the input's gradient in FP8; the frozen weight gets no gradient. The weights
stay stored in the compute dtype (the saving is time, not memory; a QLoRA base saves memory and is the other
switch). FP8 units exist on NVIDIA Hopper and Ada (compute capability 8.9 and up: H100, H200, L40S, B200) and AMD
CDNA 3 and up (gfx942 MI300X/MI325X, gfx950 MI355X); elsewhere (a CPU, an A100, an MI250X) torch emulates or refuses
the matmul, so the run is refused in one line before it trains.
"""

from __future__ import annotations

from scaletrain.errors import ConfigError

FP8_AMD_ARCHS = ("gfx94", "gfx95")  # CDNA 3 (MI300X, MI325X) and CDNA 4 (MI355X)
MIN_NVIDIA_CAPABILITY = (8, 9)  # Ada and Hopper: the first with FP8 tensor cores
DIM_MULTIPLE = 16  # torch._scaled_mm wants both matrix dimensions a multiple of 16


def fp8_device_error(device: str, capability: tuple[int, int] | None = None, arch: str | None = None) -> str | None:
    """Why ``device`` cannot run FP8 matmuls, or None. ``capability``: an NVIDIA GPU's (major, minor); ``arch``: an
    AMD GPU's gcnArchName (ROCm builds report it)."""
    if device == "cpu":
        return "a CPU has no FP8 units (torch would emulate the matmuls, slower than bf16)"
    if arch:
        if arch.startswith(FP8_AMD_ARCHS):
            return None
        return f"this AMD GPU ({arch.split(':')[0]}) has no FP8 matmuls (MI300X/MI325X/MI355X have)"
    if capability is not None and tuple(capability) < MIN_NVIDIA_CAPABILITY:
        return (f"this NVIDIA GPU (compute capability {capability[0]}.{capability[1]}) has no FP8 tensor cores "
                f"(8.9 and up: L40S, H100, H200, B200)")
    return None


def check_device(device: str) -> None:
    """The worker's check of its own device (one line naming it and the fix)."""
    import torch

    capability = arch = None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        arch = getattr(props, "gcnArchName", None) if torch.version.hip else None
        capability = (props.major, props.minor)
    if why := fp8_device_error("cpu" if device == "cpu" else "gpu", capability, arch):
        raise ConfigError(f"model.fp8_base: {why}; remove model.fp8_base (bf16 base) or use "
                          f"model.quantization_bit: 4 to save memory instead")


def convertible(module) -> bool:
    return module.in_features % DIM_MULTIPLE == 0 and module.out_features % DIM_MULTIPLE == 0


def convert_base(model, linears: list[tuple[str, object]]) -> tuple[int, tuple[str, ...]]:
    """Swap the given frozen linear layers (the blocks', quantize.block_linears) for torchao's Float8Linear, in
    place, before LoRA; returns (layers converted, names kept: a dimension not a multiple of 16)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    names = {name for name, m in linears if convertible(m)}
    kept = tuple(name for name, _ in linears if name not in names)
    convert_to_float8_training(model, module_filter_fn=lambda module, fqn: fqn in names,
                               config=Float8LinearConfig())
    return len(names), kept


def note(layers: int, kept: tuple[str, ...]) -> str:
    extra = f"; {len(kept)} kept in the compute dtype (a dimension not a multiple of 16)" if kept else ""
    return (f"fp8 base: {layers} linear layers of the decoder blocks compute in FP8 (torchao Float8Linear, e4m3, "
            f"dynamic per-tensor scales: forward and input gradients), weights stored in the compute dtype, LoRA "
            f"on top in it{extra}")

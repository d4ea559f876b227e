"""FLOPs per token and MFU over a table of vendor peak throughput (dense, no sparsity).

FLOPs per token (Kaplan et al. 2020; PaLM appendix B): full fine-tuning costs 6N + 12*L*d*S per token,
with N the non-embedding parameters, L layers, d the hidden size and S the sequence length: 2N forward,
4N backward (activation and weight gradients), and the attention score/value matmuls, 2*2*L*d*S forward,
tripled for backward. LoRA freezes the base: the backward pass still propagates activation gradients (2N)
but computes no weight gradients for frozen weights, so 4N + 6*N_lora + 12*L*d*S.

An unknown device gives MFU "n/a" with a warning, never a guessed peak (falling back to A100 numbers
reports MFU over 100% on an MI300X).
"""

from __future__ import annotations

import re
import warnings

# Peak dense TFLOP/s per device and dtype. Sources (collected in shared/reference/peak_flops.csv):
# - AMD MI300X: ROCm docs, ROCm/ROCm@e396b489 docs/conceptual/gpu-arch/mi300.md, peak-performance table.
# - AMD MI325X, MI355X: ROCm blog, ROCm/rocm-blogs@74cb9876 blogs/software-tools-optimization/matrix-cores-cdna
#   (MI325X tf32 and MI355X bf16 from stas00/ml-engineering@744d01e1 compute/accelerator/README.md).
# - AMD MI250X (whole OAM, and bf16 per GCD as torchtitan tools/utils.py get_peak_flops), MI210 (AnandTech's
#   AMD-provided spec table; MI210 bf16/tf32 and MI250X tf32/fp8 are not published, so absent).
# - NVIDIA A100/H100/H200: Lightning-AI fabric/utilities/throughput.py _CUDA_FLOPS (dense); fp8 and H100 PCIe
#   fp32 from mosaicml/composer speed_monitor.py (sparse datasheet figures halved). B200: stas00 table.
# compute time = FLOPs / (peak x this): a typical dense bf16 fine-tune on one device (`plan`'s step time, and the
# rate the length-dependent part of a micro-batch runs at when the wait for the slowest rank is sized)
ASSUMED_MFU = 0.4

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "MI210": {"fp32": 22.6, "fp16": 181.0},
    "MI250X": {"fp32": 47.9, "fp16": 383.0, "bf16": 383.0},
    "MI250X-GCD": {"bf16": 191.5},
    "MI300X": {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
    "MI325X": {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
    "MI355X": {"fp32": 157.3, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "H100-SXM": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0},
    "H100-PCIE": {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
    "H200": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0},
    "B200": {"fp32": 80.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
}


# Device memory per GPU in GiB (HBM stacks come in binary sizes: the vendors' "GB" here are GiB), from the
# vendors' datasheets: AMD Instinct MI210 (64 GB HBM2e), MI250X (128 GB HBM2e), MI300X (192 GB HBM3), MI325X
# (256 GB HBM3E), MI355X (288 GB HBM3E) product pages at amd.com/en/products/accelerators/instinct; NVIDIA A100
# 40/80 GB (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), H100 SXM/PCIe 80 GB and H200 141 GB (NVIDIA
# H100 / H200 Tensor Core GPU datasheets; the links are collected in astroC86/gpu-datasheet README.md), B200 180
# GB (NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs). The runtime keeps some for itself: the plan adds a
# framework overhead instead of shrinking these.
DEVICE_MEMORY_GIB: dict[str, float] = {
    "MI210": 64, "MI250X": 128, "MI250X-GCD": 64, "MI300X": 192, "MI325X": 256, "MI355X": 288,
    "A100": 80, "A100-40GB": 40, "H100-SXM": 80, "H100-PCIE": 80, "H200": 141, "B200": 180,
}


def device_key(name: str) -> str | None:
    """Table key for a device name as torch reports it ("AMD Instinct MI300X", "NVIDIA H100 80GB HBM3")."""
    n = name.upper()
    if "MI250" in n:  # torch sees each GCD of an MI250/MI250X as its own device ("AMD Instinct MI250X/MI250")
        return "MI250X-GCD"
    for amd in ("MI355X", "MI325X", "MI300X", "MI210"):
        if amd in n:
            return amd
    if re.search(r"\bA100\b", n):
        return "A100"
    if "H100" in n:
        return "H100-PCIE" if "PCIE" in n else "H100-SXM"
    if "H200" in n:
        return "H200"
    if "B200" in n:
        return "B200"
    return None


def peak_tflops(device_name: str, dtype: str) -> float | None:
    key = device_key(device_name)
    peak = PEAK_TFLOPS.get(key, {}).get(dtype) if key else None
    if peak is None:
        warnings.warn(f"no peak {dtype} TFLOP/s known for '{device_name}': MFU is n/a (never a guessed peak)",
                      stacklevel=2)
    return peak


def flops_per_token(n_params: int, n_layers: int, hidden: int, seq_len: int, lora_params: int | None = None) -> float:
    """Training FLOPs per token (see the module docstring); ``n_params`` excludes embeddings."""
    attention = 12 * n_layers * hidden * seq_len
    if lora_params is None:
        return 6 * n_params + attention
    return 4 * n_params + 6 * lora_params + attention


def mfu(tokens_per_s_per_device: float, flops_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the peak is unknown."""
    if not peak:
        return None
    return tokens_per_s_per_device * flops_token / (peak * 1e12)


def model_flops_facts(model) -> dict[str, int]:
    """Non-embedding and LoRA parameter counts, layers and hidden size of an HF (or peft) model; an MoE model's
    routed experts count top-k/E (the FLOPs a token costs: moe.py)."""
    from scaletrain.model.moe import active_parameters, experts_of

    cfg = getattr(model, "config", None)
    named = list(model.named_parameters())
    emb = sum(p.numel() for name, p in named if "embed" in name or "wte" in name or "wpe" in name)
    lora = sum(p.numel() for n, p in named if "lora_" in n)
    _, active = active_parameters([(n, p) for n, p in named if "lora_" not in n],
                                  experts_of(cfg) if cfg is not None else None)
    return {"n_params": active - emb, "lora_params": lora, "n_layers": getattr(cfg, "num_hidden_layers", 0),
            "hidden": getattr(cfg, "hidden_size", 0)}

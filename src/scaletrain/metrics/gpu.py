"""GPU readers for the system sampler: amdsmi on AMD, nvidia-ml-py (pynvml) on NVIDIA.

Each reader is built for one device, found by its PCI bus id so the visible-device renumbering of
HIP/CUDA_VISIBLE_DEVICES cannot point it at the wrong GPU. Fields a device does not report are left out.
"""

from __future__ import annotations

GIB = 1024**3


class NvmlReader:
    def __init__(self, pynvml, bus_id: str):
        self.nv = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)

    def sample(self) -> dict[str, float]:
        nv, h, out = self.nv, self.handle, {}
        _try(out, "gpu/util_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu)
        mem = _call(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            out["gpu/memory_used_gib"] = mem.used / GIB
            out["gpu/memory_total_gib"] = mem.total / GIB
        _try(out, "gpu/power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)  # milliwatts
        _try(out, "gpu/temp_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        return out


class AmdSmiReader:
    def __init__(self, amdsmi, bus_id: str):
        self.amd = amdsmi
        amdsmi.amdsmi_init()
        self.handle = amdsmi.amdsmi_get_processor_handle_from_bdf(bus_id)

    def sample(self) -> dict[str, float]:
        a, h, out = self.amd, self.handle, {}
        _try(out, "gpu/util_pct", lambda: a.amdsmi_get_gpu_activity(h)["gfx_activity"])
        used = _call(lambda: a.amdsmi_get_gpu_memory_usage(h, a.AmdSmiMemoryType.VRAM))
        total = _call(lambda: a.amdsmi_get_gpu_memory_total(h, a.AmdSmiMemoryType.VRAM))
        if used is not None:
            out["gpu/memory_used_gib"] = used / GIB
        if total is not None:
            out["gpu/memory_total_gib"] = total / GIB
        power = _call(lambda: a.amdsmi_get_power_info(h))
        if isinstance(power, dict):
            watts = power.get("current_socket_power") or power.get("average_socket_power")
            if isinstance(watts, (int, float)):
                out["gpu/power_w"] = float(watts)
        _try(out, "gpu/temp_c", lambda: a.amdsmi_get_temp_metric(h, a.AmdSmiTemperatureType.HOTSPOT,
                                                                   a.AmdSmiTemperatureMetric.CURRENT))
        return out


def _call(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a metric this device or driver does not support
        return None


def _try(out: dict, key: str, fn) -> None:
    value = _call(fn)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out[key] = float(value)


def reader_for(device: str, vendor: str):
    """A reader for this worker's GPU, or None (CPU worker, or no management library installed)."""
    if not device.startswith("cuda"):
        return None
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    try:
        if vendor == "rocm":
            import amdsmi

            return AmdSmiReader(amdsmi, bus)
        import pynvml

        return NvmlReader(pynvml, bus)
    except Exception:  # noqa: BLE001 - library missing or the device not found: torch counters still report memory
        return None

"""GPU readers for the system sampler and for GPU health: amdsmi on AMD, nvidia-ml-py (pynvml) on NVIDIA.

Each reader is built for one device, found by its PCI bus id so the visible-device renumbering of
HIP/CUDA_VISIBLE_DEVICES cannot point it at the wrong GPU. Fields a device does not report are left out.

Health (``health()``, read at a worker's start and at its failure): uncorrectable and correctable ECC errors
(NVML's volatile totals; amdsmi's total ECC count), retired memory pages and whether a retirement is pending
(NVML retired pages and remapped rows; amdsmi's bad pages and their status). A failure on a GPU whose
uncorrectable count rose, or that has a retirement pending, is likely a hardware fault (``hardware_fault``).
"""

from __future__ import annotations

import re

GIB = 1024**3
# Added to a failed worker's exception as a note (its traceback carries it to Ray Train's controller, where
# launch/ray_callbacks.py NodeExclusion reads it): which Ray node to leave out of the restart.
_FAULTY_NODE = re.compile(r"\[scaletrain: exclude ray node ([0-9a-f]{16,})\]")


def faulty_node_note(note: str, node_id: str) -> str:
    return f"{note} [scaletrain: exclude ray node {node_id}]"


def faulty_nodes(text: str) -> list[str]:
    """The Ray node ids that ``faulty_node_note`` marked in a failure's text."""
    return _FAULTY_NODE.findall(text)


class NvmlReader:
    def __init__(self, pynvml, bus_id: str):
        self.nv, self.bus_id = pynvml, bus_id
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

    def health(self) -> dict:
        nv, h, out = self.nv, self.handle, {"bus_id": self.bus_id}
        for key, kind in (("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
                          ("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED")):
            _count(out, key, lambda kind=kind: nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, kind),
                                                                              nv.NVML_VOLATILE_ECC))
        pages = [_call(lambda c=c: nv.nvmlDeviceGetRetiredPages(h, getattr(nv, c))) for c in (
            "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
            "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")]
        if any(p is not None for p in pages):
            out["retired_pages"] = sum(len(p) for p in pages if p is not None)
        pending = _call(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        rows = _call(lambda: nv.nvmlDeviceGetRemappedRows(h))  # (corrected, uncorrected, pending, failed)
        if pending is not None or rows is not None:
            out["retirement_pending"] = bool(pending) or bool(rows and (rows[2] or rows[3]))
        return out


class AmdSmiReader:
    def __init__(self, amdsmi, bus_id: str):
        self.amd, self.bus_id = amdsmi, bus_id
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

    def health(self) -> dict:
        a, h, out = self.amd, self.handle, {"bus_id": self.bus_id}
        ecc = _call(lambda: a.amdsmi_get_gpu_total_ecc_count(h))
        if isinstance(ecc, dict):
            _count(out, "ecc_uncorrected", lambda: ecc["uncorrectable_count"])
            _count(out, "ecc_corrected", lambda: ecc["correctable_count"])
        pages = _call(lambda: a.amdsmi_get_gpu_bad_page_info(h))
        if isinstance(pages, list):
            status = [str(p.get("status", "")).upper() for p in pages if isinstance(p, dict)]
            out["retired_pages"] = sum("RESERVED" in s and "UNRESERVABLE" not in s for s in status)
            out["retirement_pending"] = any("PENDING" in s or "UNRESERVABLE" in s for s in status)
        return out


def gpu_health(reader) -> dict | None:
    """The GPU's health counters, or None (a CPU worker, a reader that cannot tell: never a crash)."""
    try:
        return reader.health() if reader is not None else None
    except Exception:  # noqa: BLE001 - a health reader that fails must not fail the run it watches
        return None


def hardware_fault(before: dict | None, after: dict | None) -> str | None:
    """Why a failure is likely the GPU's (its uncorrectable errors rose since the start, or a page retirement is
    pending), or None. ``before``/``after``: ``health()`` at the start and at the failure."""
    if not after:
        return None
    rose = (after.get("ecc_uncorrected") or 0) - ((before or {}).get("ecc_uncorrected") or 0)
    why = []
    if rose > 0:
        why.append(f"uncorrectable ECC errors rose by {rose} (to {after['ecc_uncorrected']})")
    if after.get("retirement_pending"):
        why.append("a memory page retirement is pending (reset the GPU to retire it)")
    return "; ".join(why) or None


def _call(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a metric this device or driver does not support
        return None


def _count(out: dict, key: str, fn) -> None:
    value = _call(fn)
    if isinstance(value, int) and not isinstance(value, bool):
        out[key] = value


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

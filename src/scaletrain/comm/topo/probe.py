"""Find the topology of this machine: Python APIs first (amdsmi, pynvml), then the vendor CLIs."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter

from scaletrain.comm.topo.model import Link, LinkInfo, Topology
from scaletrain.comm.topo.parsers import parse_amd_smi, parse_nvidia_smi, parse_rocm_smi

CLI_TIMEOUT_S = 20

# NVML topology levels (nvmlGpuTopologyLevel_t) -> our link kinds.
_NVML_LEVELS = {0: Link.PIX, 10: Link.PIX, 20: Link.PXB, 30: Link.PHB, 40: Link.NODE, 50: Link.SYS}


def from_amdsmi(amdsmi) -> Topology | None:
    """Through the amdsmi Python API (ROCm): link type, hops and weight for every pair, NUMA per GPU."""
    amdsmi.amdsmi_init()
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        if not handles:
            return None
        names = [amdsmi.amdsmi_get_gpu_device_bdf(h) for h in handles]
        topo = Topology("amdsmi", names)
        for i, a in enumerate(handles):
            topo.numa[i] = amdsmi.amdsmi_topo_get_numa_node_number(a)
            for j, b in enumerate(handles):
                if i == j:
                    continue
                info = amdsmi.amdsmi_topo_get_link_type(a, b)
                kind = getattr(info["type"], "name", str(info["type"])).upper()
                weight = amdsmi.amdsmi_topo_get_link_weight(a, b)
                topo.links[(i, j)] = LinkInfo(Link.XGMI if "XGMI" in kind else Link.PCIE if "PCI" in kind
                                              else Link.UNKNOWN, hops=info.get("hops"), weight=weight)
        return topo
    finally:
        amdsmi.amdsmi_shut_down()


def from_pynvml(pynvml) -> Topology | None:
    """Through NVML: the common PCIe ancestor of each pair, plus active NVLinks counted per peer."""
    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            return None
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        bus = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
        bus = [b.decode() if isinstance(b, bytes) else b for b in bus]
        topo = Topology("pynvml", [f"GPU{i}" for i in range(n)])
        nvlinks: list[Counter] = []
        for h in handles:
            peers = Counter()
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
                except pynvml.NVMLError:
                    continue
                peers[remote.decode() if isinstance(remote, bytes) else remote] += 1
            nvlinks.append(peers)
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                width = nvlinks[i].get(bus[j], 0)
                if width:
                    topo.links[(i, j)] = LinkInfo(Link.NVLINK, width=width)
                else:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    topo.links[(i, j)] = LinkInfo(_NVML_LEVELS.get(int(level), Link.UNKNOWN))
        return topo
    finally:
        pynvml.nvmlShutdown()


def _run(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def detect() -> Topology:
    """The first source that answers; a Topology with no GPUs (and a note saying why) otherwise."""
    for module, reader in (("amdsmi", from_amdsmi), ("pynvml", from_pynvml)):
        try:
            topo = reader(__import__(module))
        except Exception:  # noqa: BLE001 - not installed, no driver, or no device: try the next source
            topo = None
        if topo is not None and topo.count:
            return topo
    for cmd, parser in ((["amd-smi", "topology"], parse_amd_smi), (["rocm-smi", "--showtopo"], parse_rocm_smi),
                        (["nvidia-smi", "topo", "-m"], parse_nvidia_smi)):
        text = _run(cmd)
        if text:
            try:
                return parser(text)
            except (StopIteration, KeyError, ValueError, IndexError):
                continue
    import torch

    return Topology("none", [], note=f"no GPU present: torch {torch.__version__} sees none, and neither the amdsmi/"
                                     f"pynvml Python APIs nor amd-smi, rocm-smi or nvidia-smi answered")

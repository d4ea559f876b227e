"""The topology model shared by every source (amdsmi, pynvml, amd-smi, rocm-smi, nvidia-smi)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from itertools import combinations


class Link(enum.Enum):
    """How two GPUs reach each other, fastest first. Names follow nvidia-smi / rocm-smi legends."""

    SELF = "X"
    NVLINK = "NV"  # bonded NVLinks (NV#)
    XGMI = "XGMI"  # AMD Infinity Fabric
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PCIE = "PCIE"  # PCIe, path not detailed (rocm-smi / amd-smi)
    PHB = "PHB"  # through a PCIe host bridge (the CPU)
    NODE = "NODE"  # between host bridges inside one NUMA node
    SYS = "SYS"  # across the SMP interconnect between NUMA nodes
    UNKNOWN = "?"

    @property
    def fast(self) -> bool:
        return self in (Link.NVLINK, Link.XGMI)

    @property
    def pcie(self) -> bool:
        return self in (Link.PIX, Link.PXB, Link.PCIE, Link.PHB, Link.NODE, Link.SYS)


_ORDER = list(Link)


@dataclass(frozen=True)
class LinkInfo:
    kind: Link
    width: int | None = None  # number of bonded NVLinks
    hops: int | None = None
    weight: int | None = None

    @property
    def label(self) -> str:
        if self.kind is Link.NVLINK:
            return f"NV{self.width}" if self.width else "NV"
        return self.kind.value


def parse_label(text: str) -> LinkInfo:
    t = text.strip().upper()
    if t in ("X", "SELF", "0", ""):
        return LinkInfo(Link.SELF)
    if t.startswith("NV") and t[2:].isdigit():
        return LinkInfo(Link.NVLINK, width=int(t[2:]))
    try:
        return LinkInfo(Link(t))
    except ValueError:
        return LinkInfo(Link.UNKNOWN)


@dataclass
class Topology:
    source: str
    gpus: list[str]
    links: dict[tuple[int, int], LinkInfo] = field(default_factory=dict)
    numa: dict[int, int | None] = field(default_factory=dict)
    note: str = ""

    @property
    def count(self) -> int:
        return len(self.gpus)

    def link(self, i: int, j: int) -> LinkInfo:
        if i == j:
            return LinkInfo(Link.SELF)
        return self.links.get((i, j)) or self.links.get((j, i)) or LinkInfo(Link.UNKNOWN)

    def has_fast_links(self) -> bool:
        return any(info.kind.fast for info in self.links.values())

    def warnings(self, job_gpus: list[int] | None = None) -> list[str]:
        """Pairs of the job's GPUs that use PCIe or cross NUMA nodes while something better exists."""
        gpus = list(range(self.count)) if job_gpus is None else job_gpus
        out: list[str] = []
        slow = [(i, j) for i, j in combinations(gpus, 2) if self.link(i, j).kind.pcie]
        if slow and self.has_fast_links():
            fast_pairs = [(i, j) for (i, j), info in self.links.items() if i < j and info.kind.fast]
            kinds = sorted({self.link(i, j).label for i, j in fast_pairs})
            shown = ", ".join(f"GPU{i}-GPU{j} ({self.link(i, j).label})" for i, j in slow[:6])
            more = f" and {len(slow) - 6} more" if len(slow) > 6 else ""
            out.append(f"{len(slow)} GPU pair(s) of the job talk over PCIe: {shown}{more}, while this node has "
                       f"{'/'.join(kinds)} links; choose GPUs that share them (visible-devices variable) "
                       f"or expect bus bandwidth far below the link's")
        cross = [(i, j) for i, j in combinations(gpus, 2)
                 if self.link(i, j).kind.pcie and None not in (self.numa.get(i), self.numa.get(j))
                 and self.numa.get(i) != self.numa.get(j)]
        if cross:
            nodes = sorted({self.numa[g] for g in gpus if self.numa.get(g) is not None})
            same = {n: [g for g in range(self.count) if self.numa.get(g) == n] for n in nodes}
            fits = [n for n, members in same.items() if len(members) >= len(gpus)]
            hint = (f"GPUs {', '.join(map(str, same[fits[0]]))} share NUMA node {fits[0]}" if fits
                    else "bind each worker to its GPU's NUMA node")
            out.append(f"{len(cross)} GPU pair(s) of the job cross NUMA nodes {', '.join(map(str, nodes))} over "
                       f"PCIe/SMP (e.g. GPU{cross[0][0]}-GPU{cross[0][1]}); {hint}")
        return out

    def matrix(self) -> list[list[str]]:
        """Rows like `nvidia-smi topo -m`: header, then one row per GPU with its NUMA node."""
        rows = [[""] + [f"GPU{i}" for i in range(self.count)] + ["NUMA"]]
        for i in range(self.count):
            numa = self.numa.get(i)
            rows.append([f"GPU{i}"] + [self.link(i, j).label for j in range(self.count)]
                        + ["N/A" if numa is None else str(numa)])
        return rows

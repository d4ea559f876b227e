"""Parsers for `nvidia-smi topo -m`, `rocm-smi --showtopo` / `--showtoponuma`, `amd-smi topology` (text and JSON)."""

from __future__ import annotations

import json
import re

from scaletrain.comm.topo.model import LinkInfo, Topology, parse_label

_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\S+)$")


def parse_nvidia_smi(text: str) -> Topology:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # The header is the first line naming GPU0 that has no row label (it starts with blanks).
    header_idx = next(i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln) and ln[:1].isspace())
    columns = [tok for tok in lines[header_idx].split() if _DEVICE.match(tok)]
    gpus = [c for c in columns if c.startswith("GPU")]
    topo = Topology("nvidia-smi topo -m", gpus)
    for ln in lines[header_idx + 1:]:
        if ln.startswith("Legend"):
            break
        toks = ln.split()
        if not toks or not toks[0].startswith("GPU"):
            continue
        i = gpus.index(toks[0])
        cells = toks[1:1 + len(columns)]
        for col, cell in zip(columns, cells):
            if col.startswith("GPU") and col != toks[0]:
                topo.links[(i, gpus.index(col))] = parse_label(cell)
        rest = toks[1 + len(columns):]  # CPU affinity, NUMA affinity, GPU NUMA ID (newer drivers)
        topo.numa[i] = int(rest[1]) if len(rest) >= 2 and rest[1].isdigit() else None
    return topo


def _tables(text: str, title_re: str) -> dict[str, list[list[str]]]:
    """Split `=== Title ===` (rocm-smi) or `TITLE TABLE:` (amd-smi) sections into token rows."""
    sections: dict[str, list[list[str]]] = {}
    current = None
    for ln in text.splitlines():
        m = re.match(title_re, ln.strip())
        if m:
            current = m.group(1).strip().lower()
            sections[current] = []
            continue
        if current is not None and ln.strip() and not ln.startswith("="):
            sections[current].append(ln.split())
    return sections


def _matrix(rows: list[list[str]]) -> tuple[list[str], dict[tuple[int, int], str]]:
    header = rows[0]
    cells = {}
    for r, row in enumerate(rows[1:1 + len(header)]):
        for c, value in enumerate(row[1:1 + len(header)]):
            cells[(r, c)] = value
    return header, cells


def parse_rocm_smi(text: str) -> Topology:
    sections = _tables(text, r"^=+\s*(.+?)\s*=+$")
    link_rows = sections.get("link type between two gpus")
    numa = {int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"GPU\[(\d+)\]\s*:\s*\(Topology\) Numa Node:\s*(-?\d+)", text)}
    if link_rows:
        gpus, kinds = _matrix(link_rows)
    else:  # --showtoponuma: NUMA section only
        gpus, kinds = [f"GPU{i}" for i in sorted(numa)], {}
    topo = Topology("rocm-smi --showtopo", gpus)
    _fill_links(topo, kinds, sections.get("hops between two gpus"), sections.get("weight between two gpus"))
    topo.numa = {i: (n if n >= 0 else None) for i, n in numa.items()}
    return topo


def parse_amd_smi(text: str) -> Topology:
    stripped = text.lstrip()
    if stripped.startswith("[") or stripped.startswith("{"):
        return parse_amd_smi_json(stripped)
    sections = _tables(text, r"^([A-Z][A-Z /-]+?) TABLE:$")
    if "link type" not in sections:  # e.g. `amd-smi topology -cndz`: P2P capability tables only
        header = next(iter(sections.values()))[0] if sections else []
        return Topology("amd-smi topology", header, note="this output has no LINK TYPE table")
    header, kinds = _matrix(sections["link type"])
    topo = Topology("amd-smi topology", header)
    _fill_links(topo, kinds, sections.get("hops"), sections.get("weight"))
    return topo


def _fill_links(topo: Topology, kinds: dict, hop_rows: list | None, weight_rows: list | None) -> None:
    """Link type per pair from the LINK TYPE table, with hops and weight where those tables exist."""
    hops = _matrix(hop_rows)[1] if hop_rows else {}
    weight = _matrix(weight_rows)[1] if weight_rows else {}
    for (i, j), kind in kinds.items():
        if i != j:
            topo.links[(i, j)] = LinkInfo(parse_label(kind).kind, hops=_int(hops.get((i, j))),
                                          weight=_int(weight.get((i, j))))


def parse_amd_smi_json(text: str) -> Topology:
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("topology", [data])
    names = [entry.get("bdf") or f"GPU{entry['gpu']}" for entry in data]
    topo = Topology("amd-smi topology --json", names)
    for entry in data:
        i = entry["gpu"]
        if "links" in entry:  # newer format: a list of links per GPU
            for link in entry["links"]:
                if link["gpu"] != i:
                    topo.links[(i, link["gpu"])] = LinkInfo(parse_label(link["link_type"]).kind,
                                                            hops=_int(link.get("num_hops")),
                                                            weight=_int(link.get("weight")))
        else:  # older format: tables keyed by "gpu_N"
            for key, kind in entry.get("link_type", {}).items():
                j = int(key.split("_")[1])
                if j != i:
                    topo.links[(i, j)] = LinkInfo(parse_label(kind).kind, hops=_int(entry.get("hops", {}).get(key)),
                                                  weight=_int(entry.get("weight", {}).get(key)))
    return topo


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

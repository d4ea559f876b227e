"""GPU-to-GPU link topology: a model, parsers for vendor tool output, live probes, and warnings."""

from scaletrain.comm.topo.model import Link, LinkInfo, Topology
from scaletrain.comm.topo.probe import detect

__all__ = ["Link", "LinkInfo", "Topology", "detect"]

"""Topology parsers against recorded tool outputs (../shared/reference) and our own fixtures; probes with fakes."""

import types

import pytest

from scaletrain.comm.topo.model import Link, LinkInfo, Topology
from scaletrain.comm.topo.parsers import parse_amd_smi, parse_nvidia_smi, parse_rocm_smi
from scaletrain.comm.topo.probe import detect, from_amdsmi, from_pynvml
from tests.conftest import reference_file


def ref(name):
    return reference_file(name).read_text()


def all_pairs(topo):
    return {topo.link(i, j).label for i in range(topo.count) for j in range(topo.count) if i != j}


def test_8x_h100_all_nvlink_no_warnings():
    t = parse_nvidia_smi(ref("nvidia-smi-topo-8xH100.txt"))
    assert t.count == 8 and all_pairs(t) == {"NV18"}
    assert [t.numa[i] for i in range(8)] == [0] * 4 + [1] * 4
    assert t.warnings() == []  # NVLink across NUMA nodes is fine


def test_8x_a100_with_nics_ignores_nic_rows():
    t = parse_nvidia_smi(ref("nvidia-smi-topo-8xA100-NV12.txt"))
    assert t.count == 8 and all_pairs(t) == {"NV12"} and t.gpus[-1] == "GPU7"


def test_mixed_nvlink_pairs_and_sys_warns_for_the_slow_pair():
    t = parse_nvidia_smi(ref("nvidia-smi-topo-4xGPU-NV3pairs-traverse.txt"))
    assert t.link(0, 1).label == "NV3" and t.link(0, 2).kind is Link.SYS and t.numa == {0: 0, 1: 0, 2: 8, 3: 8}
    assert t.warnings([0, 1]) == []
    warns = t.warnings([0, 2])
    assert any("talk over PCIe: GPU0-GPU2 (SYS)" in w and "NV3" in w for w in warns)
    assert any("cross NUMA nodes 0, 8" in w and "GPUs 0, 1 share NUMA node 0" in w for w in warns)


def test_pcie_box_numa_crossing():
    t = parse_nvidia_smi(ref("nvidia-smi-topo-8xPCIe-SYS.txt"))
    assert all_pairs(t) == {"SYS"}
    assert t.warnings([0, 1, 2, 3]) == []  # one NUMA node, no faster link to prefer
    assert "cross NUMA nodes 0, 1" in t.warnings([0, 4])[0]


@pytest.mark.parametrize("name,label,numa", [
    ("nvidia-smi-topo-2xRTX2080Ti-PIX.txt", "PIX", {0: 1, 1: 1}),
    ("nvidia-smi-topo-2xGTX1080Ti-PHB.txt", "PHB", {0: None, 1: None}),  # older driver: no NUMA column
    ("nvidia-smi-topo-4xA10-SYS.txt", "SYS", {0: 0, 1: 0, 2: 0, 3: 0}),
])
def test_small_pcie_boxes(name, label, numa):
    t = parse_nvidia_smi(ref(name))
    assert t.link(0, 1).label == label and t.numa == numa


def test_single_gpu():
    t = parse_nvidia_smi(ref("nvidia-smi-topo-1xL40S.txt"))
    assert t.count == 1 and t.links == {} and t.warnings() == []


def test_rocm_smi_8x_mi308x_all_xgmi():
    t = parse_rocm_smi(ref("rocm-smi-showtopo-8xMI308X.txt"))
    assert t.count == 8 and all_pairs(t) == {"XGMI"}
    assert t.link(0, 7).hops == 1 and t.link(0, 7).weight == 15
    assert t.numa == {i: 0 if i < 4 else 1 for i in range(8)} and t.warnings() == []


def test_rocm_smi_mi100_pcie_without_bridge():
    t = parse_rocm_smi(ref("rocm-smi-showtopo-4xMI100-PCIe.txt"))
    assert all_pairs(t) == {"PCIE"} and t.link(0, 2).weight == 40 and t.link(0, 1).hops == 3
    assert "cross NUMA nodes 1, 7" in t.warnings([0, 1])[0]


def test_rocm_smi_numa_only_output():
    t = parse_rocm_smi(ref("rocm-smi-showtoponuma-8xMI210.txt"))
    assert t.count == 8 and [t.numa[i] for i in range(8)] == [3, 2, 1, 0, 7, 6, 5, 4]


def test_amd_smi_text_and_json():
    t = parse_amd_smi(ref("amd-smi-topology-8xMI300-series.txt"))
    assert t.count == 8 and t.gpus[0] == "0000:0c:00.0" and all_pairs(t) == {"XGMI"}
    pcie = parse_amd_smi(ref("amd-smi-topology-2xRX7900XTX-PCIe.txt"))
    assert pcie.link(0, 1).kind is Link.PCIE and pcie.link(0, 1).hops == 2
    old = parse_amd_smi(ref("amd-smi-topology-json-2xPCIe.txt"))
    new = parse_amd_smi(ref("amd-smi-topology-a-t-json-2xPCIe.txt"))
    assert old.link(0, 1).kind is new.link(0, 1).kind is Link.PCIE
    assert new.gpus == ["0000:08:00.0", "0000:44:00.0"]
    caps = parse_amd_smi(ref("amd-smi-topology-cndz-8xMI300-series.txt"))
    assert caps.count == 8 and "no LINK TYPE" in caps.note


# Our own fixture: a 4-GPU box where XGMI joins 0-1 and 2-3 only, tab-separated like the real tool.
OWN_ROCM = """
=========================== Link Type between two GPUs ===========================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            XGMI         PCIE         PCIE
GPU1   XGMI         0            PCIE         PCIE
GPU2   PCIE         PCIE         0            XGMI
GPU3   PCIE         PCIE         XGMI         0
================================== Numa Nodes ====================================
GPU[0]\t\t: (Topology) Numa Node: 0
GPU[1]\t\t: (Topology) Numa Node: 0
GPU[2]\t\t: (Topology) Numa Node: 1
GPU[3]\t\t: (Topology) Numa Node: 1
"""


def test_own_fixture_mixed_xgmi_pcie():
    t = parse_rocm_smi(OWN_ROCM)
    assert t.warnings([0, 1]) == [] and t.warnings([2, 3]) == []
    w = t.warnings([1, 2])
    assert "GPU1-GPU2 (PCIE)" in w[0] and "XGMI" in w[0] and "cross NUMA nodes 0, 1" in w[1]
    assert t.matrix()[1] == ["GPU0", "X", "XGMI", "PCIE", "PCIE", "0"]


def _fake_pynvml():
    bus = ["0000:01:00.0", "0000:02:00.0", "0000:81:00.0"]

    class Err(Exception):
        pass

    def state(h, link):
        return 1 if h == 0 and link < 4 or h == 1 and link < 4 else 0

    def remote(h, link):
        return types.SimpleNamespace(busId=bus[1 - h].encode())

    return types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetHandleByIndex=lambda i: i, NVML_NVLINK_MAX_LINKS=6, NVML_FEATURE_ENABLED=1, NVMLError=Err,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=bus[h].encode()),
        nvmlDeviceGetNvLinkState=state, nvmlDeviceGetNvLinkRemotePciInfo=remote,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 50 if 2 in (a, b) else 30,
    )


def test_pynvml_probe_counts_nvlinks_and_pcie_levels():
    t = from_pynvml(_fake_pynvml())
    assert t.link(0, 1).label == "NV4" and t.link(0, 2).kind is Link.SYS and t.link(1, 2).kind is Link.SYS
    assert "talk over PCIe" in t.warnings([0, 2])[0]


def test_amdsmi_probe():
    kinds = {(0, 1): "AMDSMI_IOLINK_TYPE_XGMI", (1, 0): "AMDSMI_IOLINK_TYPE_XGMI"}
    calls = []
    fake = types.SimpleNamespace(
        amdsmi_init=lambda: calls.append("init"), amdsmi_shut_down=lambda: calls.append("down"),
        amdsmi_get_processor_handles=lambda: ["h0", "h1", "h2"],
        amdsmi_get_gpu_device_bdf=lambda h: f"0000:0{h[1]}:00.0",
        amdsmi_topo_get_numa_node_number=lambda h: 0 if h != "h2" else 1,
        amdsmi_topo_get_link_type=lambda a, b: {
            "hops": 1,
            "type": types.SimpleNamespace(name=kinds.get((int(a[1]), int(b[1])), "AMDSMI_IOLINK_TYPE_PCIEXPRESS"))},
        amdsmi_topo_get_link_weight=lambda a, b: 15,
    )
    t = from_amdsmi(fake)
    assert t.link(0, 1).kind is Link.XGMI and t.link(0, 2).kind is Link.PCIE and t.numa == {0: 0, 1: 0, 2: 1}
    assert calls == ["init", "down"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cpu_only_machine_says_no_gpu(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    t = detect()
    assert t.count == 0 and "no GPU present" in t.note


def test_unknown_pair_is_reported_as_unknown():
    t = Topology("x", ["GPU0", "GPU1"], {(0, 1): LinkInfo(Link.UNKNOWN)})
    assert t.link(1, 0).label == "?" and t.warnings() == []


def test_topo_prints_a_saved_tables_links_and_refuses_gpus_it_does_not_have():
    """`scaletrain topo --from-file` in this process (tests/cli.py): the table of links and NUMA nodes; GPUs the
    node does not have are one line naming them."""
    from tests.cli import run_cli

    path = reference_file("nvidia-smi-topo-4xA10-SYS.txt")
    shown = run_cli("topo", "--from-file", path, "--gpus", "0,2")
    text = shown.stdout + shown.stderr
    assert shown.returncode == 0 and "GPU topology (nvidia-smi topo -m)" in text
    assert "│ GPU2 │ SYS  │ SYS  │ X    │ SYS  │ 0    │" in text
    refused = run_cli("topo", "--from-file", path, "--gpus", "0,9")
    assert refused.returncode != 0 and "--gpus 0,9: this node has GPUs 0-3" in refused.stderr
    assert "Traceback" not in refused.stderr

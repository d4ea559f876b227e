"""Named network profiles: the all-reduce bus bandwidth of the devices people train on, each with its source.

A profile is an intra-node curve (busbw in GB/s by message size, nccl-tests / rccl-tests `all_reduce_perf`,
float, out-of-place), an optional inter-node curve, the GPUs per node it was measured with, and the node's
topology ("switch": NVSwitch or a PCIe ring, flat for any GPU count; "full-mesh": xGMI, see predict.py). Only a
measured, citable figure goes in; where a source gives the plateau but not the whole curve, the ramp of a measured
curve of the same kind (single node or spanning nodes) is scaled to that plateau, and the profile says so. A device
with no citable figure has no profile: `plan` and `predict` say so and how to measure one (`commbench`).

Each curve's ``latency_s`` is the 8-byte all-reduce's out-of-place time of the same output (a curve whose ramp is
borrowed borrows it too). Sources, in the style of shared/reference/SOURCES.md (the figures below were copied from
them, not derived):

- mi300x intra: hisohara/ai-scripts @ 7b8b1ec2, training/01_rccl-smoketest/README.md, "RCCL Tests with MPI (AAC8
  Kubernetes)": 8x MI300X in one pod over xGMI, RCCL 2.22, rows 1 MiB .. 256 MiB (shared/reference/
  rccl-tests-all_reduce_perf-8xMI300X.txt holds the same output; a test compares them).
- mi300x inter: the same file, "AAC10 MI300X Slurm": 2 nodes x 8 MI300X, 8 RoCE NICs per node, rows 16 MiB ..
  256 MiB (shared/reference/rccl-tests-all_reduce_perf-2node-16xMI300X.txt).
- mi325x: the same file, "AAC11 MI325X Slurm" (rocm 6.4.1): 1 node x 8 MI325X 316.88 GB/s at 4 GiB, 2 nodes x 8
  347.23 GB/s at 4 GiB (only the 4/8/16 GiB rows are published). MI325X keeps MI300X's xGMI links, so the curves
  are MI300X's above scaled to these plateaus (x 316.88/315.26 inside a node, x 347.23/353.40 across nodes,
  MI300X's own 4 GiB rows).
- h100-sxm inter: lessizzmore/create-a3mega-ztan-fork @ 02dd8f45, file ztan-NCCL-test-result: 2 nodes x 8 H100
  80GB HBM3 (GCP A3 Mega), rows 1 MiB .. 8 GiB (shared/reference/nccl-tests-all_reduce_perf-2node-16xH100.txt;
  a test compares them).
- h100-sxm intra: no single-node 8x H100 nccl-tests output with a citable repository was found (SOURCES.md says
  the same). NVIDIA's engineers give the plateau: "an effective NVLink bandwidth of 370GB/s, which you can observe
  as BusBw ... with NCCL_ALGO=RING" and ~480 GB/s for all-reduce with NVLink SHARP (NVIDIA/nccl-tests#212);
  "476GB/s looks to be in the expected range for H100" on one node (NVIDIA/nccl-tests#290). The profile takes 370
  (what all-gather and reduce-scatter, FSDP's collectives, get; DDP's all-reduce with NVLS runs faster, so DDP
  predictions err on the slow side) and the ramp of the single-node MI300X curve, scaled (x 370/315.69).
- h200: NVIDIA's H200 SXM datasheet gives the same NVLink 4 (900 GB/s) and NVSwitch as H100 SXM, so the profile
  is h100-sxm's. Cross-check: 248 nodes x 8 H200 measure "around 350G" busbw (NVIDIA/nccl-tests#283), against
  338.8 GB/s at 8 GiB on the 2-node H100 curve.
- a100 intra: 8x A100-SXM4-80GB over NVLink/NVSwitch, "the nccl tests show a busbw of ~200 GB/s" for all_reduce
  (NVIDIA/nccl-tests#149); an NV12 pair reaches 208 GB/s (NVIDIA/nccl-tests#178). Ramp: the single-node MI300X
  curve scaled to 200 (x 200/315.69).
- a100 inter: 3 nodes x 8 A100-SXM4-40GB, 4 HDR InfiniBand NICs each: "average performance is about 84.8GB/s and
  peak performance reaches about 96GB/s" at up to 128 MiB (NVIDIA/nccl-tests#119). Ramp: the 2-node H100 curve,
  capped at 96.
- pcie: Anthony-Hoo/Anthony-Hoo.github.io @ 74cc3588, posts/AutoDL_Multi-GPU_Interconnection_Test.md: 2x RTX
  2080 Ti behind one PCIe Gen3 switch, peer-to-peer not supported (through host memory), rows 128 KiB .. 1 GiB
  (shared/reference/nccl-tests-all_reduce_perf-2xRTX2080Ti.txt). A plain PCIe box without P2P: its ring is as
  slow as its slowest hop for any GPU count ("switch"). No inter-node curve: such jobs span nodes over whatever
  network the nodes have; measure it.
- mi250x: no citable rccl-tests all-reduce curve was found (no profile).

``link_peak_gbs`` is a GPU's links to its node's peers, theoretical, one way (the datasheets give both ways):
MI300X and MI325X 7 xGMI links of 128 GB/s both ways, "896 GB/s" peak aggregate (AMD Instinct MI300X / MI325X
datasheets): 448; H100 SXM and H200 NVLink 4, 900 GB/s (NVIDIA H100 / H200 datasheets): 450; A100 SXM NVLink 3,
600 GB/s (A100 datasheet): 300; PCIe Gen3 x16, 15.75 GB/s one way (PCI-SIG). A busbw over it is the "share of
the theoretical bandwidth" people report (a ring's busbw counts one direction).
"""

from __future__ import annotations

from scaletrain.scaling.predict import BusCurve

MiB = 1 << 20
GiB = 1 << 30

MI300X_INTRA = BusCurve(((1 * MiB, 64.64), (4 * MiB, 138.60), (16 * MiB, 195.85), (32 * MiB, 238.45),
                         (64 * MiB, 271.51), (256 * MiB, 304.96)), latency_s=19.28e-6)
MI300X_INTRA_8GIB = 315.69  # the same run's 8 GiB row: the plateau the ramp is scaled from
MI300X_INTRA_4GIB = 315.26
MI300X_INTER = BusCurve(((16 * MiB, 63.26), (32 * MiB, 106.58), (64 * MiB, 153.10), (256 * MiB, 293.75)),
                        latency_s=256.5e-6)
MI300X_INTER_4GIB = 353.40
H100_INTER = BusCurve(((1 * MiB, 9.68), (4 * MiB, 21.57), (16 * MiB, 32.18), (32 * MiB, 59.36),
                       (64 * MiB, 99.74), (128 * MiB, 152.32), (256 * MiB, 213.19), (1 * GiB, 297.86),
                       (8 * GiB, 338.82)), latency_s=135.8e-6)
PCIE_NO_P2P = BusCurve(((128 << 10, 2.30), (256 << 10, 3.05), (512 << 10, 3.49), (1 * MiB, 3.75), (2 * MiB, 3.89),
                        (4 * MiB, 3.94), (16 * MiB, 3.99), (1 * GiB, 4.00)), latency_s=12.25e-6)


def scaled(curve: BusCurve, factor: float) -> BusCurve:
    return BusCurve(tuple((size, round(bw * factor, 2)) for size, bw in curve.points), curve.latency_s)


def capped(curve: BusCurve, peak: float) -> BusCurve:
    return BusCurve(tuple((size, min(bw, peak)) for size, bw in curve.points), curve.latency_s)


H100_INTRA = scaled(MI300X_INTRA, 370 / MI300X_INTRA_8GIB)

PROFILES: dict[str, dict] = {
    "mi300x": {"gpus_per_node": 8, "link_peak_gbs": 448.0, "intra": MI300X_INTRA, "inter": MI300X_INTER,
               "topology": "full-mesh",
               "source": "rccl-tests all_reduce_perf on 8x and 2x8 MI300X (hisohara/ai-scripts, RCCL 2.22)"},
    "mi325x": {"gpus_per_node": 8, "link_peak_gbs": 448.0, "intra": scaled(MI300X_INTRA, 316.88 / MI300X_INTRA_4GIB),
               "inter": scaled(MI300X_INTER, 347.23 / MI300X_INTER_4GIB), "topology": "full-mesh",
               "source": "rccl-tests on 1x8 and 2x8 MI325X (hisohara/ai-scripts, 4 GiB rows) over MI300X's ramp"},
    "h100-sxm": {"gpus_per_node": 8, "link_peak_gbs": 450.0, "intra": H100_INTRA, "inter": H100_INTER,
                 "topology": "switch",
                 "source": "nccl-tests on 2x8 H100 (create-a3mega-ztan-fork); one node: NVIDIA's 370 GB/s ring "
                           "busbw (nccl-tests#212)"},
    "h200": {"gpus_per_node": 8, "link_peak_gbs": 450.0, "intra": H100_INTRA, "inter": H100_INTER,
             "topology": "switch",
             "source": "H100 SXM's (the same NVLink 4 and NVSwitch: H200 datasheet)"},
    "a100": {"gpus_per_node": 8, "link_peak_gbs": 300.0, "intra": scaled(MI300X_INTRA, 200 / MI300X_INTRA_8GIB),
             "inter": capped(H100_INTER, 96.0), "topology": "switch",
             "source": "8x A100-SXM4 ~200 GB/s (nccl-tests#149); 3x8 A100 with 4 HDR NICs, 96 GB/s peak "
                       "(nccl-tests#119)"},
    "pcie": {"gpus_per_node": 8, "link_peak_gbs": 15.75, "intra": PCIE_NO_P2P, "inter": None, "topology": "switch",
             "source": "nccl-tests on 2x RTX 2080 Ti, PCIe Gen3, no P2P (Anthony-Hoo.github.io, AutoDL)"},
}

# Device table keys (metrics/flops.py) that imply an interconnect. H100 PCIe boards come with or without NVLink
# bridges, and each MI250X GCD sees its siblings over links of three speeds: neither is guessed.
BY_DEVICE = {"MI300X": "mi300x", "MI325X": "mi325x", "H100-SXM": "h100-sxm", "H200": "h200", "A100": "a100"}


def profile_for(device_key: str) -> dict | None:
    name = BY_DEVICE.get(device_key) or device_key.lower()
    return PROFILES.get(name)


def missing(device_key: str) -> str:
    """What to say for a device without a profile, and how to get one."""
    return (f"no network profile for {device_key} (known: {', '.join(PROFILES)}); measure one: scaletrain "
            f"commbench -n GPUS -e 1G --out DIR, then scaletrain predict --commbench DIR/commbench.json")

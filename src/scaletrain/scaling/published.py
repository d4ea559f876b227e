"""Published multi-GPU measurements the predictor is checked against (`scaletrain predict --check-published`).

Each row holds what its source states (model, sequence, batch, strategy, device, GPU counts, the throughput at the
smallest count) and the speedups it measured; the prediction uses those inputs and the device's network profile,
with nothing tuned per row. An input the source does not state is named in ``assumed``; a row no honest model can
be compared with says why in ``no_prediction`` instead of being fitted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scaletrain.errors import ConfigError
from scaletrain.scaling.predict import Inputs, step
from scaletrain.scaling.profiles import PROFILES

TARGET = 0.15  # every comparable row's predicted speedup within 15% of the published one


@dataclass(frozen=True)
class Published:
    name: str
    source: str
    setup: str  # what the source states, in one line
    profile: str
    gpus: tuple[int, ...]  # the first is the count the compute time comes from
    speedups: tuple[float, ...]  # published speedup over gpus[0], per count (1.0 first)
    step_s: float = 0.0  # one device's measured step time at gpus[0] (samples or tokens per step / throughput)
    strategy: str = "fsdp"
    param_bytes: float = 0.0
    grad_bytes: float = 0.0
    layers: int = 32
    micro_batches: int = 1
    sync_each_micro_batch: bool = False
    # the data's lengths (a file of scaling/data/: one token count per example, with its source) and how the job
    # drew its micro-batches: the slowest-rank wait sized from them (scaling/straggler.py)
    lengths: str = ""
    sampler: str = "random"
    per_device_batch: int = 1
    linear_flops_per_token: float = 0.0  # the model's dense training FLOPs per token (metrics/flops.py)
    attention_flops_per_token: float = 0.0  # x the row's length: 12 x layers x hidden
    device: str = ""  # its peak FLOPs (metrics/flops.py PEAK_TFLOPS, bf16) x the plan's ASSUMED_MFU
    # a "communication share" the source reports per GPU count (gpus[1:]), and the reading it is compared under
    comm_share: tuple[float, ...] = ()
    comm_reading: str = ""
    assumed: str = ""  # inputs the source does not state, and what was taken
    no_prediction: str = ""  # why no honest prediction can be compared with this row
    unmatched: str = ""  # why the model misses a point of this row by more than TARGET (said, not fitted)


LLAMA3_8B = 8.03e9  # parameters of Llama-3-8B / 3.1-8B (config.json: 32 layers, d 4096, FFN 14336, vocab 128256)
LORA_R16_ALL_LINEAR = 41.9e6  # docs/tasks/scaling.md: 32 x (131,072 + 2 x 81,920 + 131,072 + 3 x 294,912)
LLAMA3_8B_EMBEDDING = 128256 * 4096  # the input embedding (metrics/flops.py counts the output layer as compute)

PUBLISHED: tuple[Published, ...] = (
    Published(
        name="seed Llama-3-8B LoRA ZeRO-3 MI300X",
        source="the project's seed measurement (issue #48; docs/tasks/scaling.md): LLaMA-Factory + DeepSpeed ZeRO-3 "
               "over RCCL, 4.2 / 7.8 / 14.5 / 27.2 samples/s at 1 / 2 / 4 / 8 MI300X",
        setup="LoRA r16 on all linear layers, seq 4096, per-device batch 4, accumulation 4, bf16",
        profile="mi300x", gpus=(1, 2, 4, 8), speedups=(1.0, 7.8 / 4.2, 14.5 / 4.2, 27.2 / 4.2),
        step_s=16 / 4.2, param_bytes=2 * LLAMA3_8B, grad_bytes=2 * LORA_R16_ALL_LINEAR, micro_batches=4,
        sync_each_micro_batch=True,  # DeepSpeed ZeRO-3 reduces gradients in every micro-batch
        lengths="alpaca_en_demo.json", sampler="random", per_device_batch=4,
        comm_share=(0.45, 0.62, 0.78),
        comm_reading="its table's 通信带宽占比 (communication bandwidth share), read as the bus bandwidth reached "
                     "over the links' theoretical peak: its text measures bandwidth that way (\"only ~40% of the "
                     "theoretical value\" before tuning)",
        # LoRA: forward and the activations' gradients of the frozen base (4P), LoRA's own (6 x its parameters),
        # and the forward again under gradient checkpointing (2P)
        linear_flops_per_token=6 * (LLAMA3_8B - LLAMA3_8B_EMBEDDING) + 6 * LORA_R16_ALL_LINEAR,
        attention_flops_per_token=12 * 32 * 4096, device="MI300X",
        assumed="the data's tokens counted with an English WordPiece vocabulary (Llama-3's tokenizer is not "
                "available offline: scaling/data/alpaca_en_demo.json); gradient checkpointing on "
                "(LLaMA-Factory's default)",
        unmatched="on one full-mesh MI300X node every communication term shrinks from 2 to 8 GPUs (one xGMI link "
                  "each for 2, seven for 8) while the measured loss grows (7%, 14%, 19%), as waiting for the "
                  "slowest rank does"),
    Published(
        name="torchtitan Llama-3.1-8B FSDP H100",
        source="pytorch/torchtitan docs/performance.md, Tables 1 and 3: FSDP, 5,762 TPS/GPU on 8 H100 and 5,605 on "
               "128 (Grand Teton, 400 Gb/s RDMA per GPU)",
        setup="full fine-tuning (pre-training), local batch 2, selective activation checkpointing, bf16 "
              "parameters, fp32 gradient reduction (torchtitan's default mixed precision)",
        profile="h100-sxm", gpus=(8, 128), speedups=(1.0, 16 * 5605 / 5762), step_s=2 * 8192 / 5762,
        param_bytes=2 * LLAMA3_8B, grad_bytes=4 * LLAMA3_8B,
        assumed="sequence 8192 (torchtitan's llama3_8b.toml; the table does not say); the inter-node curve is "
                "GCP A3 Mega's (200 Gb/s NICs), slower than the source's 400 Gb/s"),
    Published(
        name="torchtitan 8B FSDP+compile H100",
        source="pytorch/torchtitan docs/performance.md, Tables 1 and 3: FSDP + torch.compile, 6,667 TPS/GPU on 8 "
               "H100 and 6,514 on 128",
        setup="as the row above, with torch.compile (a shorter step: communication weighs more)",
        profile="h100-sxm", gpus=(8, 128), speedups=(1.0, 16 * 6514 / 6667), step_s=2 * 8192 / 6667,
        param_bytes=2 * LLAMA3_8B, grad_bytes=4 * LLAMA3_8B,
        assumed="sequence 8192 (torchtitan's llama3_8b.toml); A3 Mega's inter-node curve"),
    Published(
        name="MLPerf v5.0 Llama-2-70B LoRA MI300X",
        source="MLPerf Training v5.0 results (MLCommons, June 2025): 29.25 min on 8 MI300X, 10.91 min on 4 nodes "
               "x 8 MI300X (2.68x for 4x the GPUs)",
        setup="Llama-2-70B LoRA on GovReport, time to a target accuracy", profile="mi300x", gpus=(8, 32),
        speedups=(1.0, 29.25 / 10.91),
        no_prediction="MLPerf publishes time to train to a target accuracy: it includes start-up and evaluations "
                      "and the steps to converge, at global batch sizes each submission chooses; the results "
                      "state no per-step throughput, so the ratio mixes convergence with speed"),
)


def inputs_for(row: Published) -> Inputs:
    """The predictor's inputs from what ``row`` states; the compute time is the measured step at gpus[0] less the
    time the predictor loses there (so the prediction at gpus[0] equals the measurement)."""
    for key in ("step_s", "param_bytes", "grad_bytes"):
        if getattr(row, key) <= 0 and not (key == "param_bytes" and row.strategy == "ddp"):
            raise ConfigError(f"published row '{row.name}': {key} is missing (must be > 0)")
    if row.profile not in PROFILES:
        raise ConfigError(f"published row '{row.name}': profile {row.profile} is not one of {', '.join(PROFILES)}")
    p = PROFILES[row.profile]
    inp = Inputs(compute_s=row.step_s, grad_bytes=row.grad_bytes, intra=p["intra"], inter=p["inter"],
                 gpus_per_node=p["gpus_per_node"], topology=p["topology"], strategy=row.strategy,
                 param_bytes=row.param_bytes, n_layers=row.layers, micro_batches=row.micro_batches,
                 sync_each_micro_batch=row.sync_each_micro_batch, link_peak_gbs=p.get("link_peak_gbs", 0.0))
    if row.lengths:
        inp = replace(inp, straggler_waits=data_waits(row))
    for _ in range(50):  # a fixed point: compute + lost(compute) = the measured step
        lost = step(inp, row.gpus[0])["step_time_s"] - inp.compute_s
        inp = replace(inp, compute_s=row.step_s - lost)
    return inp


def lengths_of(name: str) -> list[int]:
    """A lengths file of scaling/data/ (one token count per example of a published row's data)."""
    import json
    from pathlib import Path

    path = Path(__file__).parent / "data" / name
    if not path.is_file():
        raise ConfigError(f"published lengths file {name}: not in {path.parent}")
    return json.loads(path.read_text())["lengths"]


def data_waits(row: Published) -> tuple[tuple[int, float], ...]:
    """The slowest-rank wait per step at each of the row's GPU counts, from its data's lengths (straggler.py)."""
    from scaletrain.metrics.flops import ASSUMED_MFU, PEAK_TFLOPS
    from scaletrain.scaling.straggler import Work, waits

    work = Work(row.linear_flops_per_token, row.attention_flops_per_token,
                PEAK_TFLOPS[row.device]["bf16"] * 1e12 * ASSUMED_MFU)
    sync = "micro" if row.strategy == "fsdp" else "step"
    found = waits(lengths_of(row.lengths), work, list(row.gpus), row.per_device_batch, row.micro_batches,
                  row.sampler, sync)
    return tuple((n, w.wait_s) for n, w in found.items())


def check(rows: tuple[Published, ...] = PUBLISHED) -> list[dict]:
    """Per row and GPU count: published and predicted speedup, the error, within TARGET or not, the largest loss."""
    out = []
    for row in rows:
        if row.no_prediction:
            out += [{"row": row.name, "gpus": n, "published": s, "predicted": None, "error": None, "within": None,
                     "why": row.no_prediction} for n, s in zip(row.gpus[1:], row.speedups[1:])]
            continue
        inp = inputs_for(row)
        base = step(inp, row.gpus[0])["step_time_s"]
        shares = dict(zip(row.gpus[1:], row.comm_share))
        for n, published in zip(row.gpus[1:], row.speedups[1:]):
            r = step(inp, n)
            predicted = n / row.gpus[0] * base / r["step_time_s"]
            error = predicted / published - 1
            within = abs(error) <= TARGET
            cv = None if within else straggler_to_match(inp, row.gpus[0], n, published)
            out.append({"row": row.name, "gpus": n, "published": published, "predicted": predicted, "error": error,
                        "within": within, "efficiency": predicted * row.gpus[0] / n,
                        "published_efficiency": published * row.gpus[0] / n, "largest_loss": r["largest_loss"],
                        "why": row.assumed if within else row.unmatched or row.assumed,
                        "straggler_cv_to_match": cv, "busbw_share": r["busbw_share"],
                        "comm_wait_share": r["comm_wait_share"], "comm_share_published": shares.get(n)})
    return out


def straggler_to_match(inp: Inputs, first: int, n: int, published: float) -> float | None:
    """The per-micro-batch compute spread across ranks (``straggler_cv``) with which the prediction at ``n`` would
    equal ``published``: a diagnostic printed beside a missed row (how large the unexplained wait is, in the unit a
    run's per-rank step times measure), never an input to the prediction. None when no spread in [0, 1] reaches
    it (the prediction is already slower)."""
    def speedup(cv: float) -> float:
        alt = replace(inp, straggler_cv=cv)
        return n / first * step(alt, first)["step_time_s"] / step(alt, n)["step_time_s"]

    lo, hi = 0.0, 1.0
    if speedup(lo) < published or speedup(hi) > published:
        return None
    for _ in range(60):  # bisection: the speedup falls as the spread grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) > published else (lo, mid)
    return (lo + hi) / 2

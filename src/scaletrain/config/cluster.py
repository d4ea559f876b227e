"""The `scaling` and `comm` sections: workers and their placement, the launcher, collectives and their timeout."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from scaletrain.config.base import _Section

MIN_COMM_TIMEOUT_S = 10  # seconds a collective may take before it counts as hung, at least


class ScalingConfig(_Section):
    num_workers: int = Field(1, ge=1, description=(
        "Workers (one process each, one GPU each on GPUs). A number, or [min, max] for elastic training (Ray "
        "launcher): the run starts once min workers fit, grows toward max when resources appear and shrinks when a "
        "node is lost, each resize a restart from the newest checkpoint that keeps the global batch of max workers."))
    min_workers: Optional[int] = Field(None, ge=1, description=(
        "Elastic training's smallest size; set by num_workers: [min, max]."))
    elastic_batch: Literal["exact", "nearest"] = Field("exact", description=(
        "Elastic: a size whose global batch differs from max workers' is an error before start (exact), or trains "
        "with the nearest accumulation (nearest; the global batch of that size is said at each resize)."))
    elastic_resize_interval_s: float = Field(60.0, gt=0, description=(
        "Elastic: how often Ray looks for room to grow, in seconds."))
    use_gpu: Literal["auto"] | bool = Field("auto", description=(
        "auto: one GPU per worker when the cluster has GPUs, else CPU workers."))
    resources_per_worker: Optional[dict[str, float]] = Field(None, description=(
        "Resources of one worker; default: every core used, none oversubscribed: {`CPU`: the node's cores / the "
        "workers on it} (a GPU worker: the node's cores / its GPUs, plus {`GPU`: 1})."))
    bind_cores: bool = Field(True, description=(
        "CPU workers: each worker's threads run on its own block of its node's cores (comm/cores.py), on a node "
        "the run has to itself (torchrun, or the local Ray it starts); false: the OS places them. GPU workers are "
        "never bound."))
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field("PACK", description=(
        "Ray placement group strategy for the workers' bundles."))
    address: Optional[str] = Field(None, description=(
        "Ray cluster to join (`auto`, `ray://host:10001`, `host:6379`); RAY_ADDRESS works too. Unset: a local Ray."))
    launcher: Literal["auto", "ray", "torchrun", "local"] = Field("auto", description=(
        "auto: with nothing of Ray's asked (no restarts, cluster or object storage), one worker runs in this process "
        "(local) and more that fit on this machine under torchrun (a quicker, lighter start); Ray otherwise. local: "
        "the worker loop in the command's own process (1 worker)."))
    nnodes: int = Field(1, ge=1, description=(
        "torchrun: nodes in the job; num_workers = nnodes x processes per node, and every node runs `scaletrain "
        "train` with its node_rank."))
    node_rank: int = Field(0, ge=0, description="torchrun: this node's rank (0 .. nnodes-1).")
    master_addr: str = Field("127.0.0.1", description="torchrun: the rendezvous host (node 0's address).")
    master_port: Optional[int] = Field(None, ge=1, le=65535, description=(
        "torchrun: the rendezvous port; a free port is chosen on 1 node when unset (required with several nodes)."))
    context_parallel: int = Field(1, ge=1, description=(
        "Context parallelism (model/context_parallel.py): each sequence split over this many ranks; the "
        "data-parallel size is num_workers / context_parallel."))
    context_parallel_method: Literal["auto", "ulysses", "ring"] = Field("auto", description=(
        "ulysses: all-to-all over heads; ring: every rank gathers keys/values; auto: ulysses when the heads divide, "
        "else ring."))

    @model_validator(mode="before")
    @classmethod
    def _range(cls, data):
        if isinstance(data, dict) and "max_workers" in data:  # Ray's ScalingConfig spelling of the range's top
            data = dict(data)
            top = data.pop("max_workers")
            if "num_workers" in data and data["num_workers"] != top:
                raise ValueError(f"scaling.max_workers={top} and scaling.num_workers={data['num_workers']} are both "
                                 f"set; keep one (num_workers: [min, max] or min_workers/max_workers)")
            data["num_workers"] = top
        if isinstance(data, dict) and isinstance(data.get("num_workers"), (list, tuple)):
            v = list(data["num_workers"])
            if len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise ValueError(f"scaling.num_workers={v}: a range is [min, max], two whole numbers, e.g. [2, 8]")
            lo, hi = v
            if lo < 1 or lo > hi:
                raise ValueError(f"scaling.num_workers=[{lo}, {hi}]: needs 1 <= min <= max, e.g. [2, 8]")
            data = {**data, "num_workers": hi, "min_workers": lo if lo < hi else None}
        return data

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.num_workers

    @property
    def data_parallel(self) -> int:
        """Ranks that see different data: the workers over the context-parallel degree."""
        return self.num_workers // self.context_parallel

    @property
    def max_workers(self) -> int:
        """The most workers the run uses (Ray's ScalingConfig name); its global batch is the run's."""
        return self.num_workers

    @model_validator(mode="after")
    def _torchrun(self) -> "ScalingConfig":
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(f"scaling.min_workers={self.min_workers} is above scaling.num_workers="
                             f"{self.num_workers}; write scaling.num_workers: [min, max]")
        if self.elastic and self.launcher == "torchrun":
            raise ValueError(f"scaling.num_workers=[{self.min_workers}, {self.num_workers}] (elastic) needs "
                             f"scaling.launcher=ray: Ray Train restarts the worker group at a new size; torchrun runs "
                             f"a fixed size here: set scaling.launcher=ray, or a fixed scaling.num_workers")
        if self.launcher == "local" and (self.num_workers > 1 or self.nnodes > 1):
            raise ValueError(f"scaling.launcher=local runs 1 worker in this process, not scaling.num_workers="
                             f"{self.num_workers}: set scaling.launcher=torchrun (this machine) or ray (a cluster)")
        cp = self.context_parallel
        if cp > 1 and self.num_workers % cp:
            raise ValueError(f"scaling.context_parallel={cp} does not divide scaling.num_workers={self.num_workers}: "
                             f"each sequence is split over {cp} ranks, so the workers come in groups of {cp}; use "
                             f"a num_workers that is a multiple of {cp}")
        if cp > 1 and self.elastic and self.min_workers % cp:
            low = max(cp, self.min_workers - self.min_workers % cp)
            raise ValueError(f"scaling.num_workers=[{self.min_workers}, {self.num_workers}] with scaling."
                             f"context_parallel={cp}: an elastic run resizes by whole groups of {cp} ranks, so both "
                             f"ends of the range are multiples of {cp}; e.g. [{low}, "
                             f"{self.num_workers}]")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"scaling.node_rank={self.node_rank} is out of range for scaling.nnodes={self.nnodes}; "
                             f"use 0..{self.nnodes - 1}")
        if self.launcher == "torchrun" and self.num_workers % self.nnodes:
            raise ValueError(f"scaling.num_workers={self.num_workers} must be a multiple of scaling.nnodes="
                             f"{self.nnodes} (the same number of processes on every node)")
        if self.launcher == "torchrun" and self.nnodes > 1 and self.master_port is None:
            raise ValueError("scaling.master_port is required with several nodes (every node must use the same); "
                             "set it, e.g. scaling.master_port=29500")
        return self


class CommConfig(_Section):
    backend: Literal["auto", "nccl", "rccl", "gloo"] = Field("auto", description=(
        "The process group's backend; auto: nccl on NVIDIA, rccl (nccl in torch) on AMD, gloo on CPU."))
    timeout_s: int = Field(1800, ge=MIN_COMM_TIMEOUT_S, description=(
        "Process-group timeout in seconds: a collective that waits longer fails, naming the rank, instead of "
        "hanging."))
    profile: Optional[str] = Field(None, description=(
        "A shipped profile (debug, rocm-mi300x, tcp-only) or a YAML file with env:; comm.env wins over it."))
    env: dict[str, str] = Field(default_factory=dict, description=(
        "Environment variables for every worker (NCCL_*, RCCL_*, TORCH_NCCL_*, ...)."))

    @field_validator("env", mode="before")
    @classmethod
    def _stringify(cls, v):
        if isinstance(v, dict):
            for k, val in v.items():
                if val is None or isinstance(val, (dict, list, tuple, set)):
                    what = "empty" if val is None else f"a {type(val).__name__}"
                    raise ValueError(f"comm.env.{k} is {what}; an environment variable is one string or number, "
                                     f"e.g. {k}: INFO")
            return {str(k): str(val) for k, val in v.items()}
        return v

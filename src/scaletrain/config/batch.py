"""Batch arithmetic, written once: the global batch, the accumulation for a world size, the steps and the LR.

Pure functions of the config (style habit 12), called by the schema (elastic ranges), the driver, ``--resume``,
the elastic worker, ``doctor`` and the planner alike. The rule they keep: a run's global batch
(per-device batch x accumulation x workers) is fixed at its start; another world size recomputes the
accumulation, so the steps, the LR schedule and the samples of every step stay the same.
"""

from __future__ import annotations

import math
from typing import Protocol

from scaletrain.config.stages import PREFERENCE_STAGES, RL_STAGES
from scaletrain.errors import ConfigError


# What the arithmetic reads of the config, named here rather than imported: the schema validates with these rules,
# so this module sits below it (config.schema.TrainConfig and Config have these fields).
class TrainConfig(Protocol):
    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    lr_scaling: str
    lr_reference_batch: int | None
    stage: str
    max_steps: int
    num_train_epochs: float
    warmup_steps: int
    warmup_ratio: float


class Config(Protocol):
    train: TrainConfig
    scaling: object  # config.cluster.ScalingConfig

    def model_copy(self, *, update: dict) -> Config: ...


def global_batch(train: TrainConfig, world_size: int) -> int:
    return train.per_device_train_batch_size * train.gradient_accumulation_steps * world_size


def accumulation_for(global_batch: int, batch: int, workers: int, exact: bool = True) -> int | None:
    """The gradient accumulation that keeps ``global_batch`` on ``workers`` (None: it cannot, exactly); with
    ``exact=False`` the nearest one (at least 1)."""
    accum, rest = divmod(global_batch, batch * workers)
    if not rest and accum >= 1:
        return accum
    return None if exact else max(1, round(global_batch / (batch * workers)))


def cannot_keep(global_batch: int, batch: int, accum: int, workers: int, sizes: list[int]) -> str:
    """The one wording of "these world sizes cannot keep the run's global batch" (--resume and elastic)."""
    return (f"the global batch {global_batch} ({batch} per device x {accum} accumulation x {workers} workers) "
            f"cannot be split over {', '.join(map(str, sizes))} worker(s) at {batch} per device; use a worker "
            f"count that divides {global_batch // batch}")


def unsplittable_sizes(batch: int, accum: int, min_workers: int, max_workers: int, group: int = 1) -> list[int]:
    """The elastic sizes in [min, max) that cannot keep the global batch of ``max_workers`` exactly. With context
    parallelism (``group`` ranks share each sequence) only whole groups are sizes, and a size's data-parallel ranks
    (size / group) split the batch."""
    gb = batch * accum * (max_workers // group)
    return [n for n in range(min_workers, max_workers, group) if accumulation_for(gb, batch, n // group) is None]


def for_world_size(cfg: Config, world_size: int) -> Config:
    """The config a worker of an elastic run trains with on ``world_size`` workers: the global batch of
    ``scaling.max_workers`` workers, through gradient_accumulation_steps (over the data-parallel ranks: the workers
    over the context-parallel degree)."""
    s, t = cfg.scaling, cfg.train
    if world_size == s.max_workers:
        return cfg
    cp = s.context_parallel
    gb = global_batch(t, s.max_workers // cp)
    accum = accumulation_for(gb, t.per_device_train_batch_size, world_size // cp, exact=s.elastic_batch == "exact")
    if accum is None or world_size % cp:  # checked at load: only a world size outside the range gets here
        raise ValueError(f"{world_size} workers cannot keep the global batch {gb}"
                         + (f" in groups of {cp} context-parallel ranks" if world_size % cp else ""))
    return cfg.model_copy(update={"train": t.model_copy(update={"gradient_accumulation_steps": accum}),
                                  "scaling": s.model_copy(update={"num_workers": world_size})})


def resized(saved: Config, new: Config) -> tuple[Config, str | None]:
    """``--resume`` on another number of workers keeps the run's global batch (``for_world_size``'s rule): the
    accumulation is recomputed. A global batch the new size cannot divide is an error; a changed per-device
    batch is no resize (``launch/resume.py`` refuses it as a change of the data order)."""
    n_old, n_new = saved.scaling.data_parallel, new.scaling.data_parallel  # context-parallel ranks share data
    b, a = saved.train.per_device_train_batch_size, saved.train.gradient_accumulation_steps
    if n_old == n_new or new.train.per_device_train_batch_size != b:
        return new, None
    gb = global_batch(saved.train, n_old)
    accum = accumulation_for(gb, b, n_new)
    if accum is None:
        raise ConfigError(f"--resume with scaling.num_workers={new.scaling.num_workers}: "
                          f"{cannot_keep(gb, b, a, n_old, [n_new])}")
    out = new.model_copy(update={"train": new.train.model_copy(update={"gradient_accumulation_steps": accum})})
    workers = f"{new.scaling.num_workers} worker(s) instead of {saved.scaling.num_workers}"
    return out, (f"resuming on {workers}: gradient_accumulation_steps {a} -> {accum} "
                 f"keeps the global batch at {gb} (the same steps, LR schedule and samples per step); the "
                 f"checkpoint reshards")


def scaled_learning_rate(train: TrainConfig, world_size: int) -> float:
    """``learning_rate`` scaled by global batch / reference batch (linear or sqrt rule).

    The reference defaults to the 1-worker global batch, so the 1-worker baseline keeps its LR.
    """
    if train.lr_scaling == "none":
        return train.learning_rate
    ref = train.lr_reference_batch or global_batch(train, 1)
    ratio = global_batch(train, world_size) / ref
    return train.learning_rate * (ratio if train.lr_scaling == "linear" else math.sqrt(ratio))


def sequences_per_micro_batch(train: TrainConfig, eval_batch: bool = False) -> int:
    """Sequences one step's forwards run per example: a preference pair is two (chosen and rejected go through one
    forward), a KTO example two (itself and its mismatched completion for the KL estimate)."""
    per = train.per_device_eval_batch_size if eval_batch else train.per_device_train_batch_size
    return per * (2 if train.stage in PREFERENCE_STAGES else 1)


def sequence_length(cfg) -> int:
    """The tokens of one trained sequence: data.max_length, and for train.stage: grpo a prompt (max_length) and its
    completion (rl.max_completion_length)."""
    grpo = cfg.train.stage in RL_STAGES
    return cfg.data.max_length + (cfg.rl.max_completion_length if grpo else 0)


def steps_per_epoch(num_train: int, train: TrainConfig, world_size: int) -> int:
    # Each rank drops its last partial micro-batch, and a partial accumulation window is dropped too.
    per_rank = num_train // world_size
    return per_rank // train.per_device_train_batch_size // train.gradient_accumulation_steps


def left_out_note(num_train: int, train: TrainConfig, world_size: int, unit: str = "examples") -> str | None:
    """What each epoch leaves out (the last partial global batch), said at start: a step is always a whole global
    batch, so that 1 and N workers train the same steps with the same token-weighted loss (parity) and a resized
    run keeps its arithmetic. The epoch order is reshuffled, so a different few are left out each epoch."""
    batch = global_batch(train, world_size)
    left = num_train - steps_per_epoch(num_train, train, world_size) * batch
    if left <= 0:
        return None
    return (f"data: each epoch trains {num_train - left} of {num_train} {unit}: the last {left} do not fill a global "
            f"batch of {batch} (a step is always a whole global batch); the order is reshuffled every epoch, so "
            f"different ones are left out; to train all, make the count a multiple of {batch}")


def total_steps(num_train: int, cfg: Config, world_size: int) -> int:
    spe = steps_per_epoch(num_train, cfg.train, world_size)
    if spe == 0:
        raise ConfigError(
            f"data.train_file has {num_train} training example(s), fewer than one global batch of "
            f"{global_batch(cfg.train, world_size)} (per_device_train_batch_size x gradient_accumulation_steps x "
            f"num_workers); lower train.per_device_train_batch_size or add data"
        )
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps
    if cfg.train.stage in RL_STAGES:  # each step's prompts are trained on rl.num_iterations steps
        spe *= cfg.rl.num_iterations
    return max(1, math.ceil(cfg.train.num_train_epochs * spe))


def warmup_steps(train: TrainConfig, total: int) -> int:
    return train.warmup_steps or int(math.ceil(train.warmup_ratio * total))


# --- the causal-LM loss chunk (worker/loss.py), from the vocabulary ----------------------------------------
MAX_CHUNK_LOGITS_BYTES = 2**28  # one chunk's fp32 logits, at most (a 128k vocabulary: 512 tokens, 256 MiB)


def default_chunk_tokens(vocab_size: int) -> int:
    """``train.loss_chunk_tokens`` when unset: the chunked loss for every vocabulary. Beside never holding the whole
    logits of a big vocabulary, it computes logits only where a token is a target (no prompt, padding or packing
    seam positions): a packed LoRA SFT of the tiny Llama (598 tokens) ran 1.24x faster with it than with the plain
    loss, a padded one the same (benchmarks/vs_llamafactory.py's job, 2026-12-06)."""
    return max(128, MAX_CHUNK_LOGITS_BYTES // (4 * vocab_size))


def chunk_tokens_for(setting: int | None, vocab_size: int) -> int:
    """``train.loss_chunk_tokens`` resolved: its value, or the default for the vocabulary (0: the plain path)."""
    return default_chunk_tokens(vocab_size) if setting is None else setting

"""`--resume`: which config changes would make a resumed run differ from the one it continues."""

from __future__ import annotations

from scaletrain.config.schema import Config
from scaletrain.errors import ConfigError

# Changing any of these changes the model, the task or the order samples are seen in
# (the per-rank data order depends on world size, batch size and seed).
RESUME_BREAKING = (
    "model.name_or_path", "model.task", "model.num_labels", "model.finetuning_type", "model.lora_rank",
    "model.lora_target", "data.train_file", "data.eval_file", "data.eval_ratio", "data.max_length",
    "data.max_samples", "train.per_device_train_batch_size", "train.gradient_accumulation_steps",
    "train.seed", "train.max_steps", "train.num_train_epochs", "scaling.num_workers",
)


def _get(cfg: Config, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# Keys the data fills in when the config leaves them unset: the saved config holds what they came to.
FROM_DATA = ("model.num_labels",)


# A new world size that keeps the global batch (``resized``) changes neither the steps nor the samples.
RESIZABLE = ("scaling.num_workers", "train.gradient_accumulation_steps")


def resume_conflicts(saved: Config, new: Config) -> list[str]:
    same_batch = _global_batch(saved) == _global_batch(new)
    return [f"{k}: {_get(saved, k)!r} -> {_get(new, k)!r}" for k in RESUME_BREAKING
            if _get(saved, k) != _get(new, k) and not (k in FROM_DATA and _get(new, k) is None)
            and not (k in RESIZABLE and same_batch)]


def _global_batch(cfg: Config) -> int:
    t = cfg.train
    return t.per_device_train_batch_size * t.gradient_accumulation_steps * cfg.scaling.num_workers


def resized(saved: Config, new: Config) -> tuple[Config, str | None]:
    """A resume on another number of workers keeps the run's global batch: gradient_accumulation_steps is
    recomputed (global = per-device batch x accumulation x workers), so the steps, the LR schedule and the samples
    of every step stay those of the run it continues. A global batch the new size cannot divide is an error."""
    n_old, n_new = saved.scaling.num_workers, new.scaling.num_workers
    if n_old == n_new or new.train.per_device_train_batch_size != saved.train.per_device_train_batch_size:
        return new, None
    from scaletrain.worker.optim import accumulation_for

    b = saved.train.per_device_train_batch_size
    global_batch = b * saved.train.gradient_accumulation_steps * n_old
    accum = accumulation_for(global_batch, b, n_new)
    if accum is None:
        raise ConfigError(f"--resume with scaling.num_workers={n_new}: the run's global batch {global_batch} = {b} "
                          f"per device x {saved.train.gradient_accumulation_steps} accumulation x {n_old} workers "
                          f"cannot be split into {b} per device x {n_new} workers; use a worker count that divides "
                          f"{global_batch // b}")
    out = new.model_copy(update={"train": new.train.model_copy(update={"gradient_accumulation_steps": accum})})
    return out, (f"resuming on {n_new} worker(s) instead of {n_old}: gradient_accumulation_steps "
                 f"{saved.train.gradient_accumulation_steps} -> {accum} keeps the global batch at {global_batch} "
                 f"(the same steps, LR schedule and samples per step); the checkpoint reshards")

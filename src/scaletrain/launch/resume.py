"""`--resume`: which config changes would make a resumed run differ from the one it continues."""

from __future__ import annotations

from scaletrain.config.schema import Config

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


def resume_conflicts(saved: Config, new: Config) -> list[str]:
    return [f"{k}: {_get(saved, k)!r} -> {_get(new, k)!r}" for k in RESUME_BREAKING
            if _get(saved, k) != _get(new, k) and not (k in FROM_DATA and _get(new, k) is None)]

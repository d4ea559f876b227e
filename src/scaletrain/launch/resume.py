"""`--resume`: the config a resumed run continues with, and which changes would make it differ."""

from __future__ import annotations

from pathlib import Path

from scaletrain.config.batch import global_batch, resized
from scaletrain.config.load import load_config
from scaletrain.config.paths import missing_paths
from scaletrain.config.schema import Config
from scaletrain.errors import ConfigError
from scaletrain.rundir import RunDir

# Changing any of these changes the model, the task or the order samples are seen in
# (the per-rank data order depends on world size, batch size and seed).
RESUME_BREAKING = (
    "model.name_or_path", "model.task", "model.num_labels", "model.finetuning_type", "model.lora_rank",
    "model.lora_target", "data.train_file", "data.eval_file", "data.eval_dataset", "data.eval_ratio",
    "data.max_length", "data.max_samples", "train.per_device_train_batch_size", "train.gradient_accumulation_steps",
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
    same_batch = (global_batch(saved.train, saved.scaling.data_parallel)
                  == global_batch(new.train, new.scaling.data_parallel))
    return [f"{k}: {_get(saved, k)!r} -> {_get(new, k)!r}" for k in RESUME_BREAKING
            if _get(saved, k) != _get(new, k) and not (k in FROM_DATA and _get(new, k) is None)
            and not (k in RESIZABLE and same_batch)]


def resume_config(run_dir: Path, config: str | None, overrides: list[str],
                  force: bool) -> tuple[Config, Path, list[str]]:
    """The config ``--resume RUN_DIR [CONFIG] [key=value ...]`` continues with: the run's saved config, or
    ``config``, with the overrides; a new world size keeps the global batch (``resized``). Returns it, the
    config file the run keeps naming, and notes for the console. Refuses a finished run and a change that
    breaks an exact resume (unless ``force``)."""
    rd = RunDir(run_dir)
    if not rd.resolved_config.is_file():
        raise ConfigError(f"--resume {run_dir}: no {RunDir.RESOLVED_CONFIG} there; pass the directory of an earlier "
                          f"run")
    if rd.finished():
        raise ConfigError(f"--resume {run_dir}: this run finished ({RunDir.SUMMARY} exists); start a new run instead")
    saved = load_config(rd.resolved_config)
    cfg, note = resized(saved, load_config(config or rd.resolved_config, overrides))
    if gone := missing_paths(cfg):
        raise ConfigError(f"--resume {run_dir}: {', '.join(gone)}, recorded by the run, does not exist on this "
                          f"machine (the run started where it does); make it available at that path (a shared "
                          f"filesystem), or give its new place as an override with --force-resume")
    conflicts = resume_conflicts(saved, cfg)
    if conflicts and not force:
        raise ConfigError(f"--resume {run_dir}: the config changes {'; '.join(conflicts)}, which breaks an exact "
                          f"resume; undo the change or pass --force-resume")
    return cfg, rd.resolved_config, [note] if note else []

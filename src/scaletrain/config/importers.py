"""Configs users already have: a LLaMA-Factory training YAML (its flat HF-Trainer-style keys) and a DeepSpeed JSON,
translated into a scaletrain config with a row per key saying where it went, or why it did not.

Pure functions of the parsed files; ``commands/imports.py`` reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError

# LLaMA-Factory keys with a scaletrain home: LF key -> (section, key).
DIRECT: dict[str, tuple[str, str]] = {
    "model_name_or_path": ("model", "name_or_path"),
    "finetuning_type": ("model", "finetuning_type"),
    "lora_rank": ("model", "lora_rank"),
    "lora_alpha": ("model", "lora_alpha"),
    "lora_dropout": ("model", "lora_dropout"),
    "dataset_dir": ("data", "dataset_dir"),
    "cutoff_len": ("data", "max_length"),
    "max_samples": ("data", "max_samples"),
    "overwrite_cache": ("data", "overwrite_cache"),
    "preprocessing_num_workers": ("data", "preprocessing_num_workers"),
    "dataloader_num_workers": ("data", "loader_workers"),
    "val_size": ("data", "eval_ratio"),
    "mask_history": ("data", "mask_history"),
    "train_on_prompt": ("data", "train_on_prompt"),
    "per_device_train_batch_size": ("train", "per_device_train_batch_size"),
    "per_device_eval_batch_size": ("train", "per_device_eval_batch_size"),
    "gradient_accumulation_steps": ("train", "gradient_accumulation_steps"),
    "learning_rate": ("train", "learning_rate"),
    "num_train_epochs": ("train", "num_train_epochs"),
    "max_steps": ("train", "max_steps"),
    "lr_scheduler_type": ("train", "lr_scheduler_type"),
    "warmup_ratio": ("train", "warmup_ratio"),
    "warmup_steps": ("train", "warmup_steps"),
    "weight_decay": ("train", "weight_decay"),
    "max_grad_norm": ("train", "max_grad_norm"),
    "adam_beta1": ("train", "adam_beta1"),
    "adam_beta2": ("train", "adam_beta2"),
    "bf16": ("train", "bf16"),
    "fp16": ("train", "fp16"),
    "seed": ("train", "seed"),
    "logging_steps": ("train", "logging_steps"),
    "eval_steps": ("train", "eval_steps"),
    "save_steps": ("checkpoint", "save_steps"),
    "save_total_limit": ("checkpoint", "save_total_limit"),
    "ddp_timeout": ("comm", "timeout_s"),
}
# Keys that have no meaning (or no equivalent) here, with the reason shown to the user.
NOT_MAPPED: dict[str, str] = {
    "do_train": "scaletrain train always trains",
    "do_eval": "scaletrain evaluates at eval_steps and at the end",
    "trust_remote_code": "only transformers' own architectures load (no remote code)",
    "plot_loss": "every run writes report.md with its loss plot",
    "overwrite_output_dir": "a run directory is never overwritten: each run gets a new one",
    "report_to": "set monitor.report_to (jsonl, tensorboard)",
    "save_only_model": "checkpoints always hold what an exact resume needs",
    "resume_from_checkpoint": "continue a run with scaletrain train --resume RUN_DIR",
    "eval_strategy": "evaluation follows train.eval_steps (0: only at the end)",
    "evaluation_strategy": "evaluation follows train.eval_steps (0: only at the end)",
    "save_strategy": "checkpoints follow checkpoint.save_steps",
    "logging_strategy": "records follow train.logging_steps",
    "eval_dataset": "give data.eval_file (one file) or let data.eval_ratio hold out a share",
    "flash_attn": "the attention implementation is transformers' default for the model",
    "ray_run_name": "set output.run_name",
    "ray_num_workers": "set scaling.num_workers",
    "packing": "not yet supported (sequence packing)",
}
# LLaMA-Factory template names -> scaletrain built-ins (LF's own names where they are the same format).
TEMPLATES = {"alpaca": "alpaca", "qwen": "chatml", "qwen2": "chatml", "qwen2_5": "chatml", "chatml": "chatml",
             "llama3": "llama3", "mistral": "mistral", "gemma": "gemma", "vicuna": "vicuna"}
LF_MARKERS = ("model_name_or_path", "stage", "finetuning_type", "dataset", "template", "do_train")


@dataclass(frozen=True)
class Row:
    key: str
    value: Any
    where: str  # "train.learning_rate", or "" when not mapped
    note: str = ""


def looks_like_llamafactory(raw: dict) -> bool:
    """A flat LLaMA-Factory YAML (not a scaletrain config with sections)."""
    return isinstance(raw, dict) and "model" not in raw and sum(k in raw for k in LF_MARKERS) >= 2


def from_llamafactory(lf: dict, deepspeed: dict | None = None, deepspeed_path: str = "") -> tuple[dict, list[Row]]:
    cfg: dict[str, dict] = {}
    rows: list[Row] = []

    def put(key: str, section: str, name: str, value: Any, note: str = "") -> None:
        cfg.setdefault(section, {})[name] = value
        rows.append(Row(key, lf.get(key, value), f"{section}.{name}", note))

    for key, value in lf.items():
        if key in DIRECT:
            section, name = DIRECT[key]
            if key == "ddp_timeout":
                value = int(value)
            put(key, section, name, value)
        elif key == "stage":
            if value == "sft":
                put(key, "model", "task", "causal-lm")
            elif value == "pt":
                put(key, "model", "task", "causal-lm")
                put(key, "data", "formatting", "text", "pre-training: loss on every token of a text column")
            else:
                rows.append(Row(key, value, "", f"stage {value} is not supported: scaletrain trains SFT and pt"))
        elif key == "lora_target":
            targets = [t.strip() for t in str(value).split(",") if t.strip()]
            put(key, "model", "lora_target", "all-linear" if targets == ["all"] else targets)
        elif key == "dataset":
            put(key, "data", "dataset", [d.strip() for d in str(value).split(",") if d.strip()])
        elif key == "template":
            if value in TEMPLATES:
                put(key, "data", "template", TEMPLATES[value])
            else:
                put(key, "data", "template", "auto", f"no built-in for LLaMA-Factory's {value!r}: the tokenizer's "
                                                     f"own chat template is used (check it matches)")
        elif key == "output_dir":
            out = Path(str(value))
            cfg.setdefault("output", {}).update(output_dir=str(out.parent) if str(out.parent) != "." else ".",
                                                run_name=out.name)
            rows.append(Row(key, value, "output.output_dir + output.run_name",
                            "scaletrain's output_dir holds run directories; the run is <output_dir>/<run_name>"))
        elif key == "deepspeed":
            rows.append(Row(key, value, "(below)", f"DeepSpeed config {value}: its rows follow"))
        elif key in NOT_MAPPED:
            rows.append(Row(key, value, "", NOT_MAPPED[key]))
        else:
            rows.append(Row(key, value, "", "no scaletrain equivalent"))
    if "dataset" in lf and "dataset_dir" not in lf:
        cfg.setdefault("data", {})["dataset_dir"] = "data"
        rows.append(Row("dataset_dir", "(default)", "data.dataset_dir", "LLaMA-Factory's default folder: data"))
    if deepspeed is not None:
        ds_train, ds_rows = from_deepspeed(deepspeed, cfg.get("train", {}), deepspeed_path)
        cfg.setdefault("train", {}).update(ds_train)
        rows += ds_rows
    return cfg, rows


def from_deepspeed(ds: dict, train: dict, source: str = "deepspeed") -> tuple[dict, list[Row]]:
    """The train-section settings of a DeepSpeed JSON; ``"auto"`` values come from ``train`` (the training keys)."""
    out: dict[str, Any] = {}
    rows: list[Row] = []
    zero = ds.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    if stage == 3:
        out["strategy"] = "fsdp"
        rows.append(Row("zero_optimization.stage", stage, "train.strategy=fsdp",
                        "ZeRO-3 = FSDP2 full sharding: parameters, gradients and optimizer state sharded"))
    else:
        out["strategy"] = "ddp"
        note = "no sharding" if stage == 0 else (
            f"ZeRO-{stage} shards the optimizer state{' and gradients' if stage == 2 else ''} across ranks; DDP "
            f"keeps a full copy on every rank: about 12 bytes per parameter more for Adam in fp32 (scaletrain has "
            f"no exact ZeRO-{stage}; train.strategy=fsdp shards everything, as ZeRO-3)")
        rows.append(Row("zero_optimization.stage", stage, "train.strategy=ddp", note))
    for part in ("offload_optimizer", "offload_param"):
        device = (zero.get(part) or {}).get("device")
        if device and device != "none":
            rows.append(Row(f"zero_optimization.{part}.device", device, "",
                            "not yet supported: FSDP CPU offload (train.fsdp_offload) is planned; the job runs "
                            "without offload"))
    for ds_key, name in (("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
                         ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                         ("gradient_clipping", "max_grad_norm")):
        if ds_key not in ds:
            continue
        value = ds[ds_key]
        if value == "auto":
            rows.append(Row(ds_key, value, f"train.{name}", f"auto: {train[name]!r} from the training keys"
                            if name in train else "auto: scaletrain's default"))
        else:
            if name in train and train[name] != value:
                raise ConfigError(f"{source}: {ds_key}={value} disagrees with the training key {name}={train[name]}; "
                                  f"make them equal (or write \"auto\" in the DeepSpeed file)")
            out[name] = value
            rows.append(Row(ds_key, value, f"train.{name}"))
    for precision in ("bf16", "fp16"):
        enabled = (ds.get(precision) or {}).get("enabled")
        if enabled is None:
            continue
        if enabled == "auto":
            rows.append(Row(f"{precision}.enabled", enabled, f"train.{precision}",
                            f"auto: {train.get(precision, False)!r} from the training keys"))
        else:
            out[precision] = bool(enabled)
            rows.append(Row(f"{precision}.enabled", enabled, f"train.{precision}"))
    for key in ("optimizer", "scheduler"):
        if key in ds:
            rows.append(Row(key, ds[key].get("type", "?"), "", "scaletrain uses AdamW with "
                            "train.lr_scheduler_type; the training keys' values apply"))
    return out, rows

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
    "use_dora": ("model", "use_dora"),
    "quantization_bit": ("model", "quantization_bit"),  # QLoRA: LF's default method (bnb) is auto's on a GPU
    "quantization_method": ("model", "quantization_method"),
    "quantization_type": ("model", "quantization_type"),
    "double_quantization": ("model", "double_quantization"),
    "freeze_vision_tower": ("model", "freeze_vision_tower"),  # a vision-language model's parts (#62), LF's names
    "freeze_multi_modal_projector": ("model", "freeze_multi_modal_projector"),
    "freeze_language_model": ("model", "freeze_language_model"),
    "image_max_pixels": ("data", "image_max_pixels"),
    "image_min_pixels": ("data", "image_min_pixels"),
    "media_dir": ("data", "media_dir"),
    "dataset_dir": ("data", "dataset_dir"),
    "cutoff_len": ("data", "max_length"),
    "max_samples": ("data", "max_samples"),
    "overwrite_cache": ("data", "overwrite_cache"),
    "preprocessing_num_workers": ("data", "preprocessing_num_workers"),
    "dataloader_num_workers": ("data", "loader_workers"),
    "val_size": ("data", "eval_ratio"),
    "mask_history": ("data", "mask_history"),
    "enable_thinking": ("data", "enable_thinking"),
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
    "torch_compile": ("train", "compile"),  # the HF Trainer's switch; here regional (each decoder block)
    "logging_steps": ("train", "logging_steps"),
    "eval_steps": ("train", "eval_steps"),
    "save_steps": ("checkpoint", "save_steps"),
    "save_total_limit": ("checkpoint", "save_total_limit"),
    "ray_num_workers": ("scaling", "num_workers"),
    "pref_beta": ("train", "pref_beta"),
    "pref_loss": ("train", "pref_loss"),
    "pref_ftx": ("train", "pref_ftx"),
    "simpo_gamma": ("train", "simpo_gamma"),
    "dpo_label_smoothing": ("train", "dpo_label_smoothing"),
    "kto_chosen_weight": ("train", "kto_chosen_weight"),
    "kto_rejected_weight": ("train", "kto_rejected_weight"),
    "moe_aux_loss_coef": ("train", "moe_aux_loss_coef"),  # here over the global batch (worker/router.py)
    "resources_per_worker": ("scaling", "resources_per_worker"),
    "placement_strategy": ("scaling", "placement_strategy"),
}
# Keys that have no meaning (or no equivalent) here, with the reason shown to the user.
NOT_MAPPED: dict[str, str] = {
    "do_train": "scaletrain train always trains",
    "do_eval": "scaletrain evaluates at eval_steps and at the end",
    "trust_remote_code": "only transformers' own architectures load (no remote code)",
    "plot_loss": "every run writes report.md with its loss plot",
    "overwrite_output_dir": "a run directory is never overwritten: each run gets a new one",
    "save_only_model": "checkpoints always hold what an exact resume needs",
    "resume_from_checkpoint": "continue a run with scaletrain train --resume RUN_DIR",
    "eval_strategy": "evaluation follows train.eval_steps (0: only at the end)",
    "evaluation_strategy": "evaluation follows train.eval_steps (0: only at the end)",
    "save_strategy": "checkpoints follow checkpoint.save_steps",
    "logging_strategy": "records follow train.logging_steps",
    "flash_attn": "the attention implementation is transformers' default for the model",
    "ray_run_name": "set output.run_name",
    "ray_storage_path": "set output.output_dir (shared storage every node sees)",
    "ray_init_kwargs": "scaletrain starts or joins Ray itself (scaling.address)",
    "ddp_find_unused_parameters": "DDP here finds unused parameters itself where LoRA or a frozen part needs it",
    "include_num_input_tokens_seen": "metrics.jsonl records the tokens seen at every step",
    "disable_tqdm": "the console shows one line per logged step, no progress bar",
    "dataloader_pin_memory": "pinned memory follows the device (on for GPUs)",
    "run_name": "set output.run_name",
    "expert_model_parallel_size": "expert parallelism is not offered: the experts are sharded with the rest of "
                                  "each decoder block by FSDP (train.strategy: fsdp)",
    "pref_bco_weight": "BCO's extra term is not in scaletrain's DPO",
    "use_ref_model": "the reference is the base with the adapters off (LoRA) or a frozen copy (full), as needed",
    "ref_model": "the reference is the initial model (a separate reference checkpoint is not yet supported)",
    "eval_on_each_dataset": "one evaluation over all eval data (eval/loss); per-dataset evaluation is not yet in "
                            "scaletrain",
}
# Stages LLaMA-Factory trains that scaletrain does not yet: the issue that covers them.
NOT_YET = {"ppo": "RL from a reward model (PPO)"}
CANNOT_RUN = "this file cannot run here"  # a row that says so: the import writes no config
# LLaMA-Factory's multimodal keys scaletrain does not have (#62): a file with any of them trains what scaletrain
# would not (audio, Gemma's pan-and-scan crops, videos in the audio track); refused whole, never turned into a
# job that drops them. Video keys in an image job (LF's VL examples carry video_max_pixels) are rows: videos are
# refused in the data itself.
MULTIMODAL_KEYS = ("image_do_pan_and_scan", "crop_to_patches", "use_audio_in_video", "audio_sampling_rate")
VIDEO_KEYS = ("video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen")
# LLaMA-Factory's templates of the vision-language models scaletrain fine-tunes: the model's own chat template (its
# processor's), which writes the image parts the model was trained on.
VL_TEMPLATES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_nothink")
IMAGE_KEYS = ("image_max_pixels", "image_min_pixels", "freeze_vision_tower", "freeze_multi_modal_projector")
# ... and of those it does not yet: the import stops (no config written).
MULTIMODAL_TEMPLATES = ("qwen2_omni", "qwen3_omni", "qwen3_5_vl", "llava", "llava_next", "llava_next_video",
                        "mllama", "paligemma", "internvl", "intern_vl", "minicpm_v", "minicpm_o", "kimi_vl", "glm4v",
                        "glm4_5v", "video_llava", "llama4_vl", "gemma3n", "pixtral")
# LLaMA-Factory's report_to values -> monitor.report_to (jsonl is always written).
REPORTERS = {"none": [], "tensorboard": ["tensorboard"], "wandb": ["wandb"], "mlflow": ["mlflow"],
             "all": ["tensorboard", "wandb", "mlflow"]}
# ddp_timeout above this is LLaMA-Factory's "wait forever" (180000000 s in its examples): there it lets ranks wait
# out rank 0's data preprocessing, which scaletrain does in the driver before any worker starts.
FOREVER_S = 24 * 3600
# LLaMA-Factory template names -> scaletrain built-ins (LF's own names where they are the same format).
# (LLaMA-Factory's qwen template writes Qwen2.5's default system prompt; its llama3 has no Llama-3.1 date header.)
TEMPLATES = {"alpaca": "alpaca", "qwen": "qwen", "chatml": "chatml", "llama3": "llama3", "mistral": "mistral",
             "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma3", "vicuna": "vicuna",
             # LF's deepseekr1 trains the last turn's reasoning (R1's own template drops every turn's): the built-in
             # does the same
             "deepseekr1": "deepseek_r1",
             # Qwen3-Instruct-2507's own template; a hybrid Qwen3's renders a training conversation the same way
             "qwen3_nothink": "qwen3_nothink"}
# Where a built-in writes a conversation differently from LLaMA-Factory's template of the same name: why.
TEMPLATE_NOTES = {
    "qwen3_nothink": "the built-in qwen3_nothink is Qwen3-Instruct-2507's own template: the last assistant turn "
                     "keeps the empty <think>\\n\\n</think>\\n\\n block that template writes (and trains it), where "
                     "LLaMA-Factory's writes none",
}
# LLaMA-Factory's templates of the models of 2025-26, each with why the model's own chat template (data.template:
# auto) is the right choice: it is what the model was trained with, and scaletrain locates every assistant turn in
# the one render of the whole conversation (data.multi_turn: spans), also where the history is written differently.
LF_OWN_TEMPLATE = {
    "qwen3": "Qwen3's own template (thinking: <think> blocks; the reasoning of turns before the last user query is "
             "dropped, as the model was trained)",
    "qwen3_5": "Qwen3.5's own template",
    "deepseek3": "DeepSeek-V3's own template",
    "gpt": "gpt-oss's own harmony template (analysis/final channels, tool calls; the built-in gpt_oss writes the "
             "same for a tokenizer without it)",
    "gpt_oss": "gpt-oss's own harmony template (analysis/final channels, tool calls; the built-in gpt_oss writes "
                 "the same for a tokenizer without it)",
    "llama4": "Llama 4's own template",
    "mistral_small": "Mistral Small's own template (its [SYSTEM_PROMPT] and tool-call format)",
    "glm4": "GLM-4's own template",
    "kimi_vl": "Kimi's own template",
}
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
            put(key, section, name, value)
        elif key in SPECIAL:
            SPECIAL[key](key, value, lf, put, rows)
        elif key == "output_dir":
            output_dir(key, value, cfg, rows)
        elif key == "deepspeed":
            rows.append(Row(key, value, "(below)", f"DeepSpeed config {value}: its rows follow"))
        elif key in VIDEO_KEYS:
            rows.append(Row(key, value, "", "videos are not supported (a videos column is refused in one line); "
                                            "images are"))
        elif key in NOT_MAPPED:
            rows.append(Row(key, value, "", NOT_MAPPED[key]))
        else:
            rows.append(Row(key, value, "", "no scaletrain equivalent"))
    _defaults(lf, cfg, rows)
    _multimodal(lf, rows)
    if deepspeed is not None:
        ds_train, ds_rows = from_deepspeed(deepspeed, cfg.get("train", {}), deepspeed_path)
        cfg.setdefault("train", {}).update(ds_train)
        rows += ds_rows
    return cfg, rows


def output_dir(key: str, value, cfg: dict, rows: list[Row]) -> None:
    """LLaMA-Factory's output_dir (the run's own folder) as scaletrain's output_dir (its parent) and run_name."""
    out = Path(str(value))
    cfg.setdefault("output", {}).update(output_dir=str(out.parent) if str(out.parent) != "." else ".",
                                        run_name=out.name)
    rows.append(Row(key, value, "output.output_dir + output.run_name",
                    "scaletrain's output_dir holds run directories; the run is <output_dir>/<run_name>"))


def _defaults(lf: dict, cfg: dict, rows: list[Row]) -> None:
    """LLaMA-Factory's own defaults where its file leaves a key unset and scaletrain's default differs."""
    data = cfg.setdefault("data", {})
    if ("dataset" in lf or "eval_dataset" in lf) and "dataset_dir" not in lf:
        data["dataset_dir"] = "data"
        rows.append(Row("dataset_dir", "(default)", "data.dataset_dir", "LLaMA-Factory's default folder: data"))
    if "val_size" not in lf and "eval_dataset" not in lf:
        data["eval_ratio"] = 0.0
        rows.append(Row("val_size", "(default 0)", "data.eval_ratio", "LLaMA-Factory holds nothing out unless "
                        "val_size is set; scaletrain's own default is 0.1"))
    if lf.get("finetuning_type", "lora") == "lora" and "lora_alpha" not in lf:
        rank = int(lf.get("lora_rank", 8))
        cfg.setdefault("model", {})["lora_alpha"] = 2 * rank
        rows.append(Row("lora_alpha", f"(default 2 x lora_rank = {2 * rank})", "model.lora_alpha",
                        "LLaMA-Factory's default; scaletrain's own is 16"))


def _multimodal(lf: dict, rows: list[Row]) -> None:
    """A vision-language job (its keys or its template): one row that stops the import (no config written)."""
    keys = [k for k in MULTIMODAL_KEYS if k in lf]
    template = lf.get("template") if lf.get("template") in MULTIMODAL_TEMPLATES else None
    if not keys and template is None:
        return
    key = keys[0] if keys else "template"
    what = f"template {template}" if template else key
    rows.append(Row(key, lf[key], "", f"a multimodal job scaletrain cannot train yet (LLaMA-Factory's {what}; "
                    f"images train with Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3), and it does not turn this file "
                    f"into a job that drops them; {CANNOT_RUN}"))


def _stage(key, value, lf, put, rows) -> None:
    if value in ("sft", "dpo", "rm", "kto"):
        put(key, "model", "task", "causal-lm")
        if value != "sft":
            put(key, "train", "stage", value, {
                "dpo": "preference tuning on chosen/rejected pairs (ranking datasets)",
                "rm": "a reward model: a scalar head, the pairwise loss (ranking datasets)",
                "kto": "KTO on replies tagged desirable or not (kto_tag)"}[value])
    elif value == "pt":
        put(key, "model", "task", "causal-lm")
        put(key, "data", "formatting", "text", "pre-training: loss on every token; every dataset is read as text "
                                               "(LLaMA-Factory's \"prompt\" column)")
    else:
        what = NOT_YET.get(value, f"stage {value}")
        rl = (" (its RL stage is train.stage: grpo, reinforcement learning with verifiable rewards: reward "
              "functions instead of a reward model, TRL's names in rl:)" if value == "ppo" else "")
        rows.append(Row(key, value, "", f"{what} is not in scaletrain (it trains sft, pt, dpo, kto, rm and "
                                        f"grpo){rl}; {CANNOT_RUN}"))


def _lora_target(key, value, lf, put, rows) -> None:
    targets = [t.strip() for t in str(value).split(",") if t.strip()]
    put(key, "model", "lora_target", "all-linear" if targets == ["all"] else targets)


def _names(key, value, lf, put, rows) -> None:
    section, name = {"dataset": ("data", "dataset"), "eval_dataset": ("data", "eval_dataset")}[key]
    put(key, section, name, [d.strip() for d in str(value).split(",") if d.strip()])


def _template(key, value, lf, put, rows) -> None:
    if value in VL_TEMPLATES or (value == "gemma3" and any(k in lf for k in IMAGE_KEYS)):  # Gemma 3 with images
        put(key, "data", "template", "auto", f"LLaMA-Factory's {value!r} -> the model's own chat template (its "
                                             f"processor's), which writes each image where the model expects it")
    elif value in TEMPLATES:
        put(key, "data", "template", TEMPLATES[value], TEMPLATE_NOTES.get(value, ""))
    elif value in LF_OWN_TEMPLATE:
        put(key, "data", "template", "auto", f"LLaMA-Factory's {value!r} -> the tokenizer's own chat template: "
                                             f"{LF_OWN_TEMPLATE[value]}")
    else:
        put(key, "data", "template", "auto", f"no built-in for LLaMA-Factory's {value!r}: the tokenizer's own chat "
                                             f"template is used (check it matches)")


def _packing(key, value, lf, put, rows) -> None:
    if key == "packing" and "neat_packing" in lf:
        rows.append(Row(key, value, "data.packing", "see neat_packing"))
        return
    on = bool(value) or bool(lf.get("neat_packing"))
    note = ("" if key == "neat_packing" or not value else
            "scaletrain packs with per-example attention (LLaMA-Factory's neat_packing): packed examples never "
            "attend to each other, which LLaMA-Factory's plain packing lets them")
    put(key, "data", "packing", on, note)


def _report_to(key, value, lf, put, rows) -> None:
    names = [value] if isinstance(value, str) else list(value or [])
    out = ["jsonl"] + [r for n in names for r in REPORTERS.get(str(n), [])]
    unknown = [n for n in names if str(n) not in REPORTERS]
    put(key, "monitor", "report_to", out, "metrics.jsonl is always written" +
        (f"; {', '.join(map(str, unknown))}: not a tracker scaletrain has" if unknown else ""))


def _group_by_length(key, value, lf, put, rows) -> None:
    on = value is True or value == "group_by_length"
    put(key, "data", "balance_ranks", on, "each step's batches are formed so ranks hold similar token counts, "
                                          "which is what grouping by length is for")


def _ddp_timeout(key, value, lf, put, rows) -> None:
    seconds = int(value)
    if seconds > FOREVER_S:
        rows.append(Row(key, value, "comm.timeout_s", f"not used: {seconds} s ({seconds / 3.156e7:.1f} years) would "
                        f"switch hang detection off. LLaMA-Factory sets it so ranks wait out rank 0's data "
                        f"preprocessing; scaletrain prepares the data before workers start, so comm.timeout_s keeps "
                        f"1800 s: a collective stuck longer names its rank and the job restarts"))
        return
    put(key, "comm", "timeout_s", seconds, f"a collective waiting longer than {seconds} s is a hang: its rank is "
                                           f"named and the job restarts")


SPECIAL = {"stage": _stage, "lora_target": _lora_target, "dataset": _names, "eval_dataset": _names,
           "template": _template, "packing": _packing, "neat_packing": _packing, "report_to": _report_to,
           "group_by_length": _group_by_length, "train_sampling_strategy": _group_by_length,
           "ddp_timeout": _ddp_timeout}


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
    done = {r.key for r in rows} | {"optimizer", "scheduler"}
    for key, value in _leaves(ds):
        if key not in done and not any(key.startswith(d + ".") for d in ("optimizer", "scheduler")):
            rows.append(Row(key, value, "", _ds_note(key)))
    return out, rows


def _leaves(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """A nested JSON object's keys as dotted paths to their values."""
    out = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        out += _leaves(v, path + ".") if isinstance(v, dict) and v else [(path, v)]
    return out


# DeepSpeed keys that change nothing here, grouped by why.
_DS_NOTES = (
    (("train_batch_size",), "the global batch is per_device_train_batch_size x workers x "
                            "gradient_accumulation_steps (config/batch.py); auto agrees with it"),
    (("fp16.",), "loss scaling: train.fp16 uses torch's GradScaler with its own dynamic scale"),
    (("bf16.",), "bf16 needs no loss scaling"),
    (("zero_optimization.stage3_gather_16bit_weights_on_model_save",),
     "final/ is always written whole, in the checkpoint dtype"),
    (("zero_optimization.",), "DeepSpeed's bucket and prefetch tuning: FSDP2/DDP size their own buckets and "
                              "prefetch one block ahead"),
    (("zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"), "scaletrain's optimizer is AdamW, tested"),
    (("steps_per_print", "wall_clock_breakdown", "flops_profiler", "comms_logger"),
     "logging follows train.logging_steps; step times and MFU are in metrics.jsonl"),
    (("activation_checkpointing.",), "set train.gradient_checkpointing"),
)


def _ds_note(key: str) -> str:
    for prefixes, note in _DS_NOTES:
        if any(key == p or (p.endswith(".") and key.startswith(p)) for p in prefixes):
            return f"ignored: {note}"
    return "no scaletrain equivalent"

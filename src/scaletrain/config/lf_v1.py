"""LLaMA-Factory v1's training YAML (``examples/v1/``: ``model``, ``model_class``, ``peft_config``,
``quant_config``, ``dist_config``, ``train_dataset``, ``micro_batch_size``, ``batching_strategy``, ...) translated
into a scaletrain config, a row per key saying where it went or why it did not, as importers.py does for the old
flat format. A file whose job cannot run here as written (an optimizer, a fine-tuning method or an export that
scaletrain does not have) gets a row saying so, and the import writes nothing (importers.CANNOT_RUN).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.config.importers import CANNOT_RUN, NOT_MAPPED, Row, from_deepspeed, output_dir

MARKERS = ("model_class", "train_dataset", "micro_batch_size", "dist_config", "peft_config", "cutoff_len",
           "sample_backend", "batching_strategy")
DIRECT: dict[str, tuple[str, str]] = {
    "model": ("model", "name_or_path"),
    "train_dataset": ("data", "train_file"),  # a dataset spec file (data/spec.py) or a data file
    "eval_dataset": ("data", "eval_file"),
    "micro_batch_size": ("train", "per_device_train_batch_size"),
    "gradient_accumulation_steps": ("train", "gradient_accumulation_steps"),
    "cutoff_len": ("data", "max_length"),
    "learning_rate": ("train", "learning_rate"),
    "max_steps": ("train", "max_steps"),
    "num_train_epochs": ("train", "num_train_epochs"),
    "bf16": ("train", "bf16"),
    "seed": ("train", "seed"),
}
SAID = {
    "kernel_config": "scaletrain picks its kernels (attention: SDPA; the chunked loss, grouped GEMM for experts where "
                     "this torch has them: doctor says which)",
    "flash_attn": "scaletrain uses torch's SDPA attention (FlashAttention's kernels where the device has them)",
    "init_config": "scaletrain builds the model on the meta device and loads the weights sharded (no rank holds "
                   "them all)",
    "sample_backend": "after training, scaletrain chat and eval generate with transformers (serve prints vLLM's "
                      "command)",
    "max_new_tokens": "scaletrain chat / eval --max-new-tokens",
    "output_dir": "",
    "trust_remote_code": NOT_MAPPED.get("trust_remote_code", "no remote code runs here"),
}
BATCHING = {
    "normal": ("balance_ranks", False, "v1's normal batching: shuffled micro-batches, each padded to its longest"),
    "dynamic_batching": ("balance_ranks", True, "scaletrain's length-balanced sampler: each step's micro-batches of "
                                                "similar lengths, dealt so the ranks hold similar token counts"),
    "padding_free": ("packing", True, "rows packed without padding, each attending only to itself"),
    "dynamic_padding_free": ("packing", True, "rows packed without padding, each attending only to itself"),
}


def looks_like_v1(raw: dict) -> bool:
    """A v1 training YAML: ``model`` is a name (not a scaletrain section) and it has v1's keys."""
    return isinstance(raw, dict) and isinstance(raw.get("model"), str) and (
        sum(k in raw for k in MARKERS) >= 2 or isinstance(raw.get("peft_config"), dict))  # (an export file)


def from_v1(lf: dict, path: str = "") -> tuple[dict, list[Row]]:
    cfg: dict[str, dict] = {"model": {"task": "causal-lm", "finetuning_type": "full"}}
    rows: list[Row] = []

    def put(key: str, section: str, name: str, value: Any, note: str = "", shown: Any = None) -> None:
        cfg.setdefault(section, {})[name] = value
        rows.append(Row(key, lf.get(key, value) if shown is None else shown, f"{section}.{name}", note))

    for key, value in lf.items():
        if key in DIRECT:
            put(key, *DIRECT[key], value, "a dataset spec file: read as v1 reads it" if key == "train_dataset"
                and str(value).endswith((".yaml", ".yml")) else "")
        elif key == "model_class":
            _model_class(value, put, rows)
        elif key == "peft_config":
            _peft(value or {}, put, rows)
        elif key == "quant_config":
            _quant(value, put, rows)
        elif key == "dist_config":
            _dist(value or {}, put, rows, path)
        elif key == "optim_config":
            _optim(value or {}, rows)
        elif key == "batching_strategy":
            name, on, note = BATCHING.get(value, (None, None, None))
            if name is None:
                rows.append(Row(key, value, "", f"unknown batching strategy (v1 has {', '.join(BATCHING)}); "
                                                f"{CANNOT_RUN}"))
            else:
                put(key, "data", name, on, note)
        elif key in ("cp_mode", "cp_size"):
            _context_parallel(key, value, lf, put, rows)
        elif key == "output_dir":
            output_dir(key, value, cfg, rows)
        elif key in SAID:
            rows.append(Row(key, value, "", SAID[key]))
        else:
            rows.append(Row(key, value, "", "no scaletrain equivalent"))
    if "batching_strategy" not in lf:  # v1's default
        put("batching_strategy", "data", "balance_ranks", False, BATCHING["normal"][2], shown="(v1's default normal)")
    if "bf16" not in lf:  # v1 trains in bf16 unless told otherwise
        cfg.setdefault("train", {})["bf16"] = True
        rows.append(Row("bf16", "(v1's default)", "train.bf16", "v1 trains in bf16 unless bf16: false"))
    cfg.setdefault("data", {}).setdefault("eval_ratio", 0.0)
    rows.append(Row("(eval)", "(none)", "data.eval_ratio", "v1 holds nothing out; scaletrain's own default is 0.1"))
    return cfg, rows


def _model_class(value, put, rows) -> None:
    if value in ("llm", None):
        put("model_class", "model", "task", "causal-lm", "a causal language model")
    else:
        rows.append(Row("model_class", value, "", f"model_class {value}: scaletrain imports v1's llm jobs (vision-"
                                                  f"language models train from the old format's files); {CANNOT_RUN}"))


def _peft(p: dict, put, rows) -> None:
    name = p.get("name")
    if name is None:
        rows.append(Row("peft_config", "(none)", "model.finetuning_type", "full fine-tuning"))
        return
    if "export_dir" in p or "adapter_name_or_path" in p:
        rows.append(Row("peft_config", name, "", f"an export file (its adapter {p.get('adapter_name_or_path')} into "
                                                 f"{p.get('export_dir')}): scaletrain export RUN_DIR merges a run's "
                                                 f"adapter; {CANNOT_RUN}"))
        return
    if name == "freeze":
        rows.append(Row("peft_config", name, "", f"freeze fine-tuning (the last {p.get('freeze_trainable_layers')} "
                                                 f"layers) is not in scaletrain, which trains LoRA or every weight; "
                                                 f"{CANNOT_RUN}"))
        return
    if name != "lora":
        rows.append(Row("peft_config", name, "", f"peft {name} is not in scaletrain (LoRA is); {CANNOT_RUN}"))
        return
    put("peft_config", "model", "finetuning_type", "lora", shown="lora")
    for key, where in (("r", "lora_rank"), ("lora_alpha", "lora_alpha"), ("lora_dropout", "lora_dropout")):
        if key in p:
            put("peft_config", "model", where, p[key], shown=f"{key}: {p[key]}")
    if "target_modules" in p:
        t = p["target_modules"]
        targets = "all-linear" if t in ("all", ["all"]) else [s.strip() for s in str(t).split(",")] if isinstance(
            t, str) else list(t)
        put("peft_config", "model", "lora_target", targets, shown=f"target_modules: {t}")


def _quant(q, put, rows) -> None:
    if not q:
        rows.append(Row("quant_config", "(none)", "", "no quantization"))
        return
    bit = q.get("quantization_bit")
    if q.get("name") not in ("bnb", "auto") or bit not in (4, 8):
        rows.append(Row("quant_config", q, "", f"quantization {q.get('name')} at {bit} bits is not one scaletrain "
                                               f"has (bitsandbytes 4 or 8 bits); {CANNOT_RUN}"))
        return
    put("quant_config", "model", "quantization_bit", bit, "QLoRA: the frozen base in bitsandbytes "
        f"{bit}-bit" + (" (v1's auto: bitsandbytes here)" if q.get("name") == "auto" else ""), shown=q)


def _dist(d: dict, put, rows, path: str) -> None:
    name = d.get("name")
    if name in ("fsdp2", "fsdpturbo"):
        put("dist_config", "train", "strategy", "fsdp", "FSDP2" if name == "fsdp2" else
            "FSDP2 (v1's fsdpturbo; scaletrain has no expert parallelism: experts are sharded as every other weight)",
            shown=name)
        for key in ("ep_size", "ep_dispatcher"):
            if key in d:
                rows.append(Row(f"dist_config.{key}", d[key], "", "expert parallelism is not in scaletrain; the "
                                                                  "experts train under FSDP"))
        if d.get("dcp_path"):
            rows.append(Row("dist_config.dcp_path", d["dcp_path"], "", "scaletrain loads the model's own files, "
                                                                       "sharded as it loads"))
    elif name == "deepspeed":
        put("dist_config", "train", "strategy", "fsdp", "DeepSpeed's ZeRO: scaletrain shards with FSDP2 (its rows "
            "follow)", shown=name)
        file = d.get("config_file")
        if file:
            import json

            ds_path = Path(str(file))
            if not ds_path.is_file() and path:
                ds_path = Path(path).parent / ds_path
            try:
                _, ds_rows = from_deepspeed(json.loads(ds_path.read_text()), {}, str(ds_path))
                rows += ds_rows
            except (OSError, ValueError):
                rows.append(Row("dist_config.config_file", file, "", "not found beside the YAML: its settings are "
                                                                     "not read"))
    else:
        rows.append(Row("dist_config", name, "", f"v1's {name} is not one scaletrain has (fsdp2, deepspeed); "
                                                 f"{CANNOT_RUN}"))


def _optim(o: dict, rows) -> None:
    name = o.get("name", "adamw")
    if name in ("adamw", "adamw_torch"):
        rows.append(Row("optim_config", name, "train (AdamW)", "scaletrain's optimizer"))
    else:
        rows.append(Row("optim_config", name, "", f"the {name} optimizer is not in scaletrain (AdamW is): training "
                                                  f"with another optimizer is another job; remove optim_config to "
                                                  f"train with AdamW; {CANNOT_RUN}"))


def _context_parallel(key, value, lf, put, rows) -> None:
    if key == "cp_mode":
        put(key, "scaling", "context_parallel_method", value if value in ("ulysses", "ring") else "auto")
    elif int(value) > 1:
        put(key, "scaling", "context_parallel", int(value), "each sequence split over this many ranks")
        put(key, "scaling", "num_workers", int(value), "v1 takes the GPUs torchrun gives it; here the workers are "
                                                       "named: at least one group of cp_size (raise it to scale)")
    else:
        rows.append(Row(key, value, "", "no context parallelism"))

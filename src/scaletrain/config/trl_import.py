"""`scaletrain import trl FILE`: a scaletrain config from the YAML a TRL user gives `trl grpo --config FILE` (TRL's
ScriptArguments, GRPOConfig and ModelConfig keys), with a row per key: where it went, or why not (#61).

GRPOConfig's own names are the `rl:` section's, so most keys map one to one; TRL's registered reward functions get
their built-in here (accuracy_reward reads TRL's `solution` column), and `module.function` paths become
`module.py:function`. A reward model (reward_model_name_or_path) cannot run here (GRPO here takes reward
functions): the import says so and writes no config, as LLaMA-Factory's PPO files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.config.importers import CANNOT_RUN, Row
from scaletrain.config.rl import RLConfig

TRAIN_KEYS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
              "num_train_epochs", "seed", "lr_scheduler_type", "warmup_ratio", "warmup_steps", "bf16", "fp16",
              "logging_steps", "weight_decay", "max_grad_norm", "gradient_checkpointing", "adam_beta1", "adam_beta2")
REWARDS = {"accuracy_reward": ("accuracy", "TRL's accuracy_reward: the answer checked against the `solution` "
                                           "column (rl.answer_column: solution), math-verify as TRL's"),
           "think_format_reward": ("format", "a <think>...</think> format reward (here: think and answer tags)"),
           "get_soft_overlong_punishment": ("length", "DAPO's soft overlong punishment over max_completion_length")}
TRL_MARKERS = ("model_name_or_path", "reward_funcs", "num_generations", "dataset_name", "max_completion_length")


def looks_like_trl(raw: dict) -> bool:
    return isinstance(raw, dict) and "model" not in raw and sum(k in raw for k in TRL_MARKERS) >= 2


def from_trl(raw: dict) -> tuple[dict, list[Row]]:
    cfg: dict[str, dict] = {"model": {"task": "causal-lm"}, "train": {"stage": "grpo"}}
    rows: list[Row] = []

    def put(key: str, section: str, name: str, value: Any, note: str = "") -> None:
        cfg.setdefault(section, {})[name] = value
        rows.append(Row(key, raw.get(key, value), f"{section}.{name}", note))

    rl_fields = set(RLConfig.model_fields)
    for key, value in raw.items():
        if key == "model_name_or_path":
            local = Path(str(value)).expanduser().exists()
            put(key, "model", "name_or_path", value, "" if local else "a hub id: scaletrain never downloads; fetch it "
                "(huggingface-cli download ID --local-dir DIR) and give the directory")
        elif key in ("dataset_name", "datasets"):
            path = value if isinstance(value, str) else None
            if path and Path(path).expanduser().exists():
                put(key, "data", "train_file", path, "TRL's prompt-only rows: a `prompt` column, the rest to rewards")
            else:
                rows.append(Row(key, value, "", "a hub dataset: scaletrain never downloads; save it to a local file "
                                                "(datasets' to_json or save_to_disk) and set data.train_file"))
        elif key == "reward_funcs":
            funcs, notes = [], []
            for name in value or []:
                if name in REWARDS:
                    funcs.append(REWARDS[name][0])
                    notes.append(REWARDS[name][1])
                    if name == "accuracy_reward":
                        cfg.setdefault("rl", {})["answer_column"] = "solution"
                elif "." in name:
                    module, fn = name.rsplit(".", 1)
                    funcs.append(f"{module.replace('.', '/')}.py:{fn}")
                    notes.append(f"{name}: the same function, from its file")
                else:
                    notes.append(f"{name}: not one of TRL's registered rewards ({', '.join(REWARDS)}) nor a "
                                 f"module.function path")
            if not funcs:  # GRPO without a reward learns nothing: the job cannot run as imported
                notes.append(f"no reward function left to train with: name one of {', '.join(REWARDS)} or a "
                             f"module.function path; {CANNOT_RUN}")
            put(key, "rl", "reward_funcs", funcs, "; ".join(notes))
        elif key == "reward_model_name_or_path" and value:
            rows.append(Row(key, value, "", f"a reward model: scaletrain's GRPO takes reward functions (rl.reward_funcs"
                                            f"), not a model's scores; {CANNOT_RUN}"))
        elif key in rl_fields:
            put(key, "rl", key, value)
        elif key in TRAIN_KEYS:
            put(key, "train", key, value)
        elif key == "use_peft":
            put(key, "model", "finetuning_type", "lora" if value else "full")
        elif key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
            name = {"lora_r": "lora_rank", "lora_target_modules": "lora_target"}.get(key, key)
            put(key, "model", name, value)
        elif key == "max_prompt_length":
            put(key, "data", "max_length", value, "a prompt's tokens at most (longer ones are skipped and counted)")
        elif key == "output_dir":
            put(key, "output", "output_dir", value)
        elif key == "use_vllm":
            if value:
                put(key, "rollout", "engine", "vllm", "vLLM on GPUs (the `vllm` extra), colocated in the workers; "
                                                      "rollout.engine: hf runs everywhere")
            else:
                put(key, "rollout", "engine", "hf")
        elif key == "vllm_gpu_memory_utilization":
            put(key, "rollout", "gpu_memory_utilization", value)
        elif key == "vllm_mode":
            put(key, "rollout", "placement", "separate" if value == "server" else "colocated")
        else:
            rows.append(Row(key, value, "", "no scaletrain equivalent"))
    return cfg, rows

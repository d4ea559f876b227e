"""The fitting runs the tests of big models share: a tiny or 100M-parameter Llama on packed SFT data, by any
launcher (test_fit_ray.py on the shared local Ray, test_fit_torchrun.py under torchrun)."""

import json

from scaletrain.config import validate
from scaletrain.launch.job import run_job


def _rows(n: int) -> list[dict]:
    import random

    rng = random.Random(9)
    words = "cold hot fast slow big small up down left right good bad".split()
    return [{"instruction": f"Say {i % 7} words", "output": " ".join(rng.choices(words, k=rng.choice([3, 20, 60])))}
            for i in range(n)]


def _run(tmp_path, name, model="builtin:tiny-llama", workers=2, steps=6, batch=2, max_length=64, save_steps=0,
         async_save=False, elastic_resize_interval_s=60.0, comm_env=None, rows=400, learning_rate=2e-3,
         launcher="ray", tokenize_on="auto", overwrite_cache=False, **train):
    data = tmp_path / f"sft-{rows}.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps(r) for r in _rows(rows)))
    finetuning = train.pop("finetuning_type", "full")
    torch_dtype = train.pop("torch_dtype", "auto")
    cfg = validate({
        "model": {"name_or_path": model, "task": "causal-lm", "dropout": 0.0, "finetuning_type": finetuning,
                  "torch_dtype": torch_dtype},
        "data": {"train_file": str(data), "eval_ratio": 0.02, "max_length": max_length, "template": "alpaca",
                 "packing": True, "max_truncated_ratio": 1.0,  # its long records are cut on purpose
                 "tokenize_on": tokenize_on, "overwrite_cache": overwrite_cache},
        "train": {"per_device_train_batch_size": batch, "per_device_eval_batch_size": batch,
                  "learning_rate": learning_rate,
                  "max_steps": steps, "logging_steps": 1, "seed": 3, "max_grad_norm": 0.0, **train},
        "scaling": {"num_workers": workers, "elastic_resize_interval_s": elastic_resize_interval_s,
                    "launcher": launcher},
        "checkpoint": {"save_steps": save_steps, "async_save": async_save},
        "monitor": {"report": False}, "comm": {"env": comm_env or {}},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": name},
    })
    return run_job(cfg, tmp_path / f"{name}.yaml", show_progress=False).run_dir


def _losses_by_step(run):
    from scaletrain.metrics.records import read_jsonl

    out = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        if r["kind"] == "train":
            out[r["step"]] = r["train/loss"]  # a step trained again after a restart: the last one counts
    return out

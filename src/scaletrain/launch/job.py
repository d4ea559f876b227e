"""The driver side of `scaletrain train`: validate, prepare data once, launch workers, finish the run directory.

Order matters for "nothing lost": everything that can fail on bad input (model path, data files,
columns, batch size, cluster size) is checked before a run directory is created.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scaletrain.comm.device import Platform
from scaletrain.config import Config, dump_config
from scaletrain.console import LiveProgress, console
from scaletrain.data import prepare_data
from scaletrain.errors import ScaletrainError
from scaletrain.launch import ray_launcher
from scaletrain.launch.rundir import create_run_dir
from scaletrain.metrics.logs import EventLog
from scaletrain.model import load_tokenizer, model_dir
from scaletrain.worker.optim import global_batch_size, scaled_learning_rate, total_steps
from scaletrain.worker.spec import JobSpec

RESOLVED_CONFIG = "config.resolved.yaml"


@dataclass(frozen=True)
class JobResult:
    run_dir: Path
    summary: dict


def run_job(cfg: Config, config_path: str | Path, resume_dir: Path | None = None, show_progress: bool = True) -> JobResult:
    vendor = Platform.detect().vendor
    model_dir(cfg.model.name_or_path)  # a missing model is an error before anything starts
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    data = prepare_data(cfg, tokenizer)
    n = cfg.scaling.num_workers
    steps = total_steps(len(data.train), cfg, n)
    lr = scaled_learning_rate(cfg.train, n)
    notes = ray_launcher.prepare_driver_env(vendor)
    started = ray_launcher.ensure_ray(cfg.scaling.address)
    try:
        plan = ray_launcher.plan_cluster(cfg, ray_launcher.cluster_resources(), vendor)
        run_dir = resume_dir or create_run_dir(cfg.output.output_dir, cfg.output.run_name, config_path)
        events = EventLog(run_dir, "driver")
        if resume_dir is None:
            (run_dir / RESOLVED_CONFIG).write_text(dump_config(cfg))
        train_path, eval_path = data.save(run_dir / "data")
        for note in notes + ([plan.note] if plan.note else []):
            console.print(f"[yellow]note:[/] {note}")
            events("note", note)
        gb = global_batch_size(cfg.train, n)
        console.print(f"run directory {run_dir}\n{n} worker(s), {plan.backend}, global batch {gb} = "
                      f"{cfg.train.per_device_train_batch_size} per device x {cfg.train.gradient_accumulation_steps} "
                      f"accumulation x {n} worker(s); lr {lr:g} ({cfg.train.lr_scaling} scaling); {steps} steps")
        events("resume" if resume_dir else "start",
               f"{n} worker(s), backend {plan.backend}, global batch {gb}, lr {lr:g}, {steps} steps, "
               f"{len(data.train)} train / {len(data.eval)} eval examples")
        spec = JobSpec(config=cfg.model_dump(mode="json"), run_dir=str(run_dir), train_path=train_path,
                       eval_path=eval_path, pad_token_id=data.pad_token_id, vocab_size=len(tokenizer),
                       backend=plan.backend, total_steps=steps, learning_rate=lr)
        env = ray_launcher.worker_env_for(cfg, vendor)
        try:
            if show_progress:
                with LiveProgress(run_dir, steps):
                    ray_launcher.run_workers(spec, cfg, plan, env)
            else:
                ray_launcher.run_workers(spec, cfg, plan, env)
        except ScaletrainError as e:
            events("failure", str(e))
            raise
        finish_final(cfg, run_dir, tokenizer)
        summary = json.loads((run_dir / "summary.json").read_text())
        return JobResult(run_dir, summary)
    finally:
        if started:
            import ray

            ray.shutdown()


def finish_final(cfg: Config, run_dir: Path, tokenizer) -> None:
    """Complete ``final/``: the tokenizer beside the weights, and a merged model for LoRA when asked."""
    final = run_dir / "final"
    tokenizer.save_pretrained(str(final))
    if cfg.model.finetuning_type != "lora":
        return
    import torch

    from scaletrain.model import build_model

    # The same seed as the workers rebuilds the same base weights.
    torch.manual_seed(cfg.train.seed)
    base = build_model(cfg.model.model_copy(update={"finetuning_type": "full"}), len(tokenizer),
                       tokenizer.pad_token_id or 0)
    if model_dir(cfg.model.name_or_path) is None:
        # A random-init built-in has no directory to load the base from: keep it beside the adapter.
        base.save_pretrained(str(final / "base"))
    if cfg.output.merge_lora:
        from peft import PeftModel

        merged = PeftModel.from_pretrained(base, str(final)).merge_and_unload()
        merged.save_pretrained(str(final / "merged"))
        tokenizer.save_pretrained(str(final / "merged"))

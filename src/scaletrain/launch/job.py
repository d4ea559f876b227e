"""The driver side of `scaletrain train`: validate, prepare data once, launch workers, finish the run directory.

Order matters for "nothing lost": everything that can fail on bad input (model path, data files,
columns, batch size, cluster size) is checked before a run directory is created.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from scaletrain.comm.device import Platform
from scaletrain.config import Config, dump_config
from scaletrain.console import LiveProgress, console
from scaletrain.data import PreparedData, prepare_data
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
    _quiet_libraries()
    vendor = Platform.detect().vendor
    model_dir(cfg.model.name_or_path)  # a missing model is an error before anything starts
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    data = prepare_data(cfg, tokenizer)
    total_steps(len(data.train), cfg, cfg.scaling.num_workers)  # too little data for one global batch
    notes = ray_launcher.prepare_driver_env(vendor)
    started = ray_launcher.ensure_ray(cfg.scaling.address)
    try:
        plan = ray_launcher.plan_cluster(cfg, ray_launcher.cluster_resources(), vendor)
        run_dir = resume_dir or create_run_dir(cfg.output.output_dir, cfg.output.run_name, config_path)
        events = EventLog(run_dir, "driver")
        if resume_dir is None:
            (run_dir / RESOLVED_CONFIG).write_text(dump_config(cfg))
        spec = build_spec(cfg, data, tokenizer, run_dir, plan.backend)
        _announce(cfg, spec, plan, notes + ([plan.note] if plan.note else []), len(data.train), len(data.eval),
                  events, resumed=resume_dir is not None)
        env = ray_launcher.worker_env_for(cfg, vendor)
        try:
            with LiveProgress(run_dir, spec.total_steps) if show_progress else contextlib.nullcontext():
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


def _announce(cfg: Config, spec: JobSpec, plan, notes: list[str], n_train: int, n_eval: int, events,
              resumed: bool) -> None:
    for note in notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
        events("note", note)
    n = cfg.scaling.num_workers
    gb = global_batch_size(cfg.train, n)
    console.print(f"run directory {spec.run_dir}", soft_wrap=True)
    console.print(f"{n} worker(s), {plan.backend}, global batch {gb} = {cfg.train.per_device_train_batch_size} per "
                  f"device x {cfg.train.gradient_accumulation_steps} accumulation x {n} worker(s); "
                  f"lr {spec.learning_rate:g} ({cfg.train.lr_scaling} scaling); {spec.total_steps} steps",
                  soft_wrap=True)
    events("resume" if resumed else "start",
           f"{n} worker(s), backend {plan.backend}, global batch {gb}, lr {spec.learning_rate:g}, "
           f"{spec.total_steps} steps, {n_train} train / {n_eval} eval examples")


def build_spec(cfg: Config, data: PreparedData, tokenizer, run_dir: Path, backend: str) -> JobSpec:
    """Save the tokenized splits into the run directory and describe the job for the workers."""
    n = cfg.scaling.num_workers
    train_path, eval_path = data.save(run_dir / "data")
    return JobSpec(config=cfg.model_dump(mode="json"), run_dir=str(run_dir), train_path=train_path,
                   eval_path=eval_path, pad_token_id=data.pad_token_id, vocab_size=len(tokenizer), backend=backend,
                   total_steps=total_steps(len(data.train), cfg, n), learning_rate=scaled_learning_rate(cfg.train, n))


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


def _quiet_libraries() -> None:
    """The driver's console is for scaletrain's lines; library chatter goes to the worker logs."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

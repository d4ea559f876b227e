"""The driver side of `scaletrain train`: validate, prepare data once, launch workers, finish the run directory.

Order matters for "nothing lost": everything that can fail on bad input (model path, data files,
columns, batch size, cluster size) is checked before a run directory is created.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from rich.markup import escape

from scaletrain import envvars
from scaletrain.comm.device import Platform
from scaletrain.comm.profiles import check_names, effective_env
from scaletrain.config import Config
from scaletrain.config.batch import global_batch, scaled_learning_rate, total_steps
from scaletrain.console import ProgressView, console
from scaletrain.data.preview import first_example
from scaletrain.errors import Interrupted, LaunchError
from scaletrain.launch import torchrun_launcher
from scaletrain.launch.failures import Decision, HangRetryPolicy, training_error
from scaletrain.launch.launcher import Launcher, choose_launcher, joins_torchrun, launcher_for
from scaletrain.launch.phases import Phases
from scaletrain.launch.preflight import Preflight, preflight
from scaletrain.metrics.goodput import DriverClock, account
from scaletrain.metrics.logs import EventLog
from scaletrain.metrics.monitor import RunMonitor, check_sinks
from scaletrain.metrics.trackers import close_trackers, start_trackers, tracker_note
from scaletrain.model.dtypes import torch_dtype
from scaletrain.model.files import final_dtype, model_dir, set_config_dtype
from scaletrain.model.processor import copy_processor_files
from scaletrain.model.tokenizer import Vocab
from scaletrain.redact import Redactor
from scaletrain.rundir import RUN_UMASK, RunDir, check_output_dir, create_run_dir
from scaletrain.storage.mirror import (
    Mirror,
    check_remote_output,
    create_remote_run,
    home_of,
    local_output_dir,
    upload_tree,
)
from scaletrain.storage.relay import download_tree
from scaletrain.storage.uri import Store, is_uri
from scaletrain.worker.faults import chaos_faults, parse_faults
from scaletrain.worker.spec import JobSpec


@dataclass(frozen=True)
class JobResult:
    run_dir: Path
    summary: dict


def run_job(cfg: Config, config_path: str | Path, resume_dir: Path | None = None, show_progress: bool = True,
            launcher: Launcher | None = None) -> JobResult:
    """``launcher``: the one the caller made early (``launcher_for``: a torchrun agent starts when it is made)."""
    os.umask(RUN_UMASK)
    cfg, chosen = choose_launcher(cfg)  # scaling.launcher: auto, made concrete (said when it is not Ray)
    redact = Redactor.from_environment(cfg.comm.env)
    if joins_torchrun(cfg):
        return _join_torchrun(cfg, redact)
    with launcher or launcher_for(cfg, redact) as launcher:
        return _run_job(cfg, config_path, resume_dir, show_progress, launcher, redact, [chosen] if chosen else [])


def _run_job(cfg: Config, config_path: str | Path, resume_dir: Path | None, show_progress: bool,
             launcher: Launcher, redact: Redactor, launch_notes: list[str]) -> JobResult:
    phases = Phases(console)  # a line per start-up phase, the first one now
    phases(f"config checked: {cfg.model.name_or_path} ({cfg.model.task}, {cfg.model.finetuning_type}) on "
           f"{cfg.scaling.num_workers} worker(s), {launcher.name}")
    _quiet_libraries()
    clock = DriverClock()  # the goodput account's launch (metrics/goodput.py)
    resumed_from = _resume_notes(resume_dir) if resume_dir is not None else []  # in seconds, before anything
    platform = Platform.detect()
    if resume_dir is None and is_uri(cfg.output.output_dir):  # a write probe: one line in seconds if it fails
        check_remote_output(cfg.output.output_dir, cfg.output.run_name, cfg.storage)
    elif resume_dir is None:
        check_output_dir(cfg.output.output_dir, cfg.output.run_name)  # before the data cache is written there
    if cfg.data.tokenize_on == "cluster" and hasattr(launcher, "connect"):  # Ray tasks tokenize: join it first
        launcher.connect()
    pre = preflight(cfg)
    cfg, tokenizer, data = pre.cfg, pre.tokenizer, pre.data  # cfg: num_labels and label names from the data
    clock.mark("prepared")
    phases(f"data and model checked: {_train_count(data)} train / {len(data.eval)} eval examples")
    check_sinks(cfg.monitor)
    notes = launch_notes + resumed_from + check_names(effective_env(cfg.comm.profile, cfg.comm.env))
    plan = launcher.plan(platform)  # the Ray launcher starts or joins Ray here: all input is checked by now
    clock.mark("cluster")
    phases(f"cluster ready ({launcher.name}, {plan.backend})")
    notes += pre.fit_notes(plan.use_gpu)
    precision = pre.precision(plan.use_gpu)  # a combination that cannot train: one line, before any worker
    notes += pre.quantization_notes(plan.use_gpu)
    if cfg.train.fsdp_offload and not plan.use_gpu:
        notes.append("train.fsdp_offload: CPU workers keep everything on the host already; nothing to offload")
    run_dir = resume_dir or new_run_dir(cfg, config_path)
    rd, store = RunDir(run_dir), home_of(run_dir)
    mirror = Mirror(run_dir, store, cfg.storage.sync_interval_s) if store else None
    clock.attach(run_dir)
    events = EventLog(run_dir, "driver", redact)
    phases.attach(events)
    if (example := first_example(tokenizer, data.train)) is not None:  # exactly what trains, in main.log
        events("first example", example)
    resolved = redact.mapping(cfg.model_dump(mode="json"))  # what the run directory and the trackers keep
    if resume_dir is None:
        rd.resolved_config.write_text(yaml.safe_dump(resolved, sort_keys=False))
    rd.stop.unlink(missing_ok=True)  # a stop request of the previous session is done
    spec = replace(build_spec(pre, run_dir, plan.backend, store), bind_cores=plan.bind_cores)
    spec = replace(spec, faults=injected_faults(cfg, spec.total_steps, events))
    if mirror is not None:  # the config and the data on the store before a worker looks for them
        mirror.sync()
        mirror.start()
    output_dir = str(local_output_dir(cfg.output.output_dir, cfg.storage))
    if said := tracker_note(cfg.monitor, run_dir, output_dir):
        notes.append(said)
    _announce(cfg, spec, plan, [*data.notes, *notes, *plan.notes], _train_count(data), len(data.eval), events,
              resumed=resume_dir is not None)
    trackers = start_trackers(cfg.monitor, run_dir, output_dir, Path(config_path).stem, resolved, events, console,
                              cfg.model.task)
    monitor = RunMonitor(run_dir, cfg.monitor, events, ProgressView(spec.total_steps) if show_progress else None,
                         console, sinks=trackers, phases=phases)
    phases("workers starting")
    try:
        try:
            with StopOnSignal(run_dir, events), monitor:
                _run_with_hang_retries(lambda: launcher.run(spec, plan), spec, cfg, redact, events)
        finally:
            clock.mark("end")
            goodput = add_goodput(rd, monitor.tree.summary())
            for sink in trackers:  # the account to W&B / MLflow too, at the run's last step
                sink.write({"kind": "goodput", "time": time.time(), **goodput})
            if cfg.monitor.report:
                _write_report(run_dir)
        if rd.stop.exists():
            raise Interrupted(f"at a checkpoint, as requested; continue with: scaletrain train --resume "
                              f"{store or run_dir}")
        if store is not None and cfg.model.finetuning_type == "lora":  # the adapter rank 0 wrote to the store
            download_tree(store.child(RunDir.FINAL), rd.final)
        finish_final(cfg, run_dir, tokenizer, precision.compute)
    finally:
        close_trackers(trackers, run_dir)  # the report, plots and final/ as the trackers' files, then their end
        if mirror is not None and (failed := mirror.close()):  # everything on the store, however the run ended
            console.print(f"[yellow]warning[/]: the run's last files did not reach {store} ({escape(failed)}); "
                          f"they are in {run_dir}", soft_wrap=True)
    return JobResult(run_dir, json.loads(rd.summary.read_text()))


def new_run_dir(cfg: Config, config_path: str | Path) -> Path:
    """A fresh run directory; on object storage, the run's local mirror (storage/mirror.py)."""
    if is_uri(cfg.output.output_dir):
        return create_remote_run(cfg.output.output_dir, cfg.output.run_name, config_path, cfg.storage)
    return create_run_dir(cfg.output.output_dir, cfg.output.run_name, config_path)


def injected_faults(cfg: Config, total_steps: int, events) -> tuple:
    """SCALETRAIN_FAULTS (tests, drills) and fault_tolerance.chaos's seeded kills (said in main.log)."""
    faults = parse_faults(envvars.read(envvars.SCALETRAIN_FAULTS) or "")
    chaos = cfg.fault_tolerance.chaos
    if chaos is None:
        return faults
    world = cfg.scaling.min_workers or cfg.scaling.num_workers  # ranks that exist at any size of an elastic run
    kills = chaos_faults(chaos.kills, chaos.mtbf_steps, chaos.seed, chaos.target, total_steps, world,
                         world // max(1, cfg.scaling.nnodes))
    events("chaos", f"{chaos.kills} kill(s) of a {chaos.target} (seed {chaos.seed}): "
                    + ", ".join(f"rank {f.rank} at step {f.step}" for f in kills))
    return faults + kills


def add_goodput(rd: RunDir, driver: dict) -> dict:
    """summary.json's goodput/* keys: where the run's wall time went, over every session (metrics/goodput.py),
    and the driver's own facts (``driver``: its process tree's peak memory); returns the goodput keys with the
    run's last step (none when the run wrote no summary)."""
    if not rd.summary.is_file():
        return {}
    summary = json.loads(rd.summary.read_text())
    summary.update(account(rd.root))
    summary.update(driver)
    rd.summary.write_text(json.dumps(summary, indent=1))
    return {"step": summary.get("steps", 0), **{k: v for k, v in summary.items()
                                                if k.startswith(("goodput/", "restarts/"))}}


def _resume_notes(run_dir: Path) -> list[str]:
    """What a resume starts from: an error when every checkpoint is unusable (training from step 0 would append
    its steps again to the run's metrics), a note when it falls back past broken newer ones."""
    from scaletrain.checkpoint import checkpoints_of, resume_point

    found, unusable = resume_point(*checkpoints_of(run_dir, home_of(run_dir)))
    broken = "; ".join(f"{name}: {problem}" for name, problem in unusable)
    if found is None and unusable:
        raise LaunchError(f"--resume {run_dir}: no checkpoint can be resumed from ({broken}); the run cannot "
                          f"continue: start a new run (its config is {RunDir(run_dir).resolved_config})")
    if unusable:
        return [f"resuming from {found.name}: the newer checkpoint(s) are unusable ({broken})"]
    return []


def _join_torchrun(cfg: Config, redact: Redactor) -> JobResult:
    """Nodes > 0 of a torchrun job: wait for node 0's spec in the shared run directory, start local workers."""
    run_dir = torchrun_launcher.shared_run_dir(cfg)
    spec_path = torchrun_launcher.wait_for_spec(run_dir)
    spec = torchrun_launcher.read_spec(spec_path)
    events = EventLog(run_dir, f"driver node {cfg.scaling.node_rank}", redact)
    events("join", f"node {cfg.scaling.node_rank} starts {cfg.scaling.num_workers // cfg.scaling.nnodes} process(es)")
    with StopOnSignal(run_dir, events), torchrun_launcher.TorchrunNode(cfg, spec_path, run_dir.name) as agent:
        _run_with_hang_retries(lambda: agent.run(spec), spec, cfg, redact, events)
    rd = RunDir(run_dir)
    return JobResult(run_dir, json.loads(rd.summary.read_text()) if rd.finished() else {})


def _run_with_hang_retries(launch, spec: JobSpec, cfg: Config, redact: Redactor, events) -> None:
    policy = HangRetryPolicy(cfg.fault_tolerance.hang_retries)
    used = 0
    while True:
        try:
            return launch()
        except Exception as e:  # noqa: BLE001 - Ray wraps worker errors; regroup them by rank and look for a hang
            error, hang = training_error(e, Path(spec.run_dir), cfg.scaling.num_workers, cfg.comm.timeout_s)
            error = type(error)(redact(str(error)))
            decision = policy.decide(hang is not None, used)
            events("failure", f"{error} (hang retries used {used} of {cfg.fault_tolerance.hang_retries}; "
                              f"decision: {decision.value})")
            if decision is Decision.RAISE:
                raise error from None
            used += 1
            console.print(f"[yellow]hang detected[/]: retrying from the newest checkpoint "
                          f"({used} of {cfg.fault_tolerance.hang_retries})", soft_wrap=True)


class StopOnSignal:
    """First Ctrl-C/SIGTERM: ask every rank to checkpoint and stop (the STOP file). Second: abort now."""

    def __init__(self, run_dir: Path, events):
        self.run_dir, self.events = run_dir, events
        self.previous = {}

    def _handle(self, signum, frame):
        stop = RunDir(self.run_dir).stop
        if stop.exists():
            raise KeyboardInterrupt
        stop.write_text(signal.Signals(signum).name)
        self.events("stop requested", f"{signal.Signals(signum).name}: saving a checkpoint at the next step")
        console.print(f"[yellow]{signal.Signals(signum).name}[/]: stopping at the next step with a checkpoint "
                      f"(again to abort without one)", soft_wrap=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _write_report(run_dir: Path) -> None:
    from scaletrain.report.markdown import write_report

    try:
        console.print(f"report: {write_report(run_dir)}", soft_wrap=True)
    except Exception as e:  # noqa: BLE001 - a report must never hide the run's own outcome
        console.print(f"[yellow]report not written[/]: {type(e).__name__}: {escape(str(e))}", soft_wrap=True)


def _announce(cfg: Config, spec: JobSpec, plan, notes: list[str], n_train: int | str, n_eval: int, events,
              resumed: bool) -> None:
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
        events("note", note)
    n, dp = cfg.scaling.num_workers, cfg.scaling.data_parallel
    gb = global_batch(cfg.train, dp)
    where = f"{spec.store} (its local mirror: {spec.run_dir})" if spec.store else spec.run_dir
    console.print(f"run directory {where}", soft_wrap=True)
    elastic = (f" (elastic: {cfg.scaling.min_workers}..{n} workers, the accumulation follows the size)"
               if cfg.scaling.elastic else "")
    console.print(f"{n} worker(s){elastic}, {plan.backend}, global batch {gb} = "
                  f"{cfg.train.per_device_train_batch_size} per "
                  f"device x {cfg.train.gradient_accumulation_steps} accumulation x {dp} data-parallel rank(s)"
                  + (f" ({n} workers / context_parallel {cfg.scaling.context_parallel})" if dp != n else "") + "; "
                  f"lr {spec.learning_rate:g} ({cfg.train.lr_scaling} scaling); {spec.total_steps} steps",
                  soft_wrap=True)
    events("resume" if resumed else "start",
           f"{n} worker(s), backend {plan.backend}, global batch {gb}, lr {spec.learning_rate:g}, "
           f"{spec.total_steps} steps, {n_train} train / {n_eval} eval examples")


def build_spec(pre: Preflight, run_dir: Path, backend: str, store: Store | None = None) -> JobSpec:
    """Save the tokenized splits into the run directory and describe the job for the workers. On object storage
    the splits go to the store (``data/train``, ``data/eval``), where the workers download them from."""
    cfg, data, n = pre.cfg, pre.data, pre.cfg.scaling.data_parallel
    train_path, eval_path = data.save(RunDir(run_dir).data)
    if store is not None:
        splits = {name: path for name, path in (("train", train_path), ("eval", eval_path)) if path}
        for split, path in splits.items():
            upload_tree(Path(path), store.child(RunDir.DATA, split))
        train_path, eval_path = (f"{RunDir.DATA}/{split}" if split in splits else "" for split in ("train", "eval"))
    return JobSpec(config=cfg.model_dump(mode="json"), run_dir=str(run_dir), train_path=train_path,
                   eval_path=eval_path, pad_token_id=data.pad_token_id, vocab_size=pre.vocab.size, backend=backend,
                   total_steps=cfg.train.max_steps if data.stream else total_steps(len(data.train), cfg, n),
                   learning_rate=scaled_learning_rate(cfg.train, n), memory_shape=pre.memory_shape(),
                   store=store.uri if store else None, stream=data.stream.to_spec() if data.stream else None)


def _train_count(data) -> str | int:
    """The train examples, or what a stream has (its shards: it is not counted before training)."""
    return f"streamed ({len(data.stream.shards)} shards)" if data.stream else len(data.train)


def finish_final(cfg: Config, run_dir: Path, tokenizer, compute: str = "fp32") -> None:
    """Complete ``final/``: the tokenizer beside the weights, and a merged model for LoRA when asked (in the
    dtype the checkpoint came in; ``compute``: the policy's compute dtype, a built-in's final dtype)."""
    final = RunDir(run_dir).final
    if cfg.model.task == "causal-lm":  # the template the run trained with, so inference renders prompts the same
        from scaletrain.data.templates import resolve_template

        tokenizer.chat_template = resolve_template(cfg.data.template, tokenizer)[1]
    tokenizer.save_pretrained(str(final))
    copy_processor_files(cfg.model.name_or_path, final)  # a vision-language model reads images as it trained
    if cfg.model.finetuning_type != "lora":
        return
    if model_dir(cfg.model.name_or_path) is not None and not cfg.output.merge_lora:
        return  # the adapter names its base directory; nothing to rebuild (scaletrain export merges shard by shard)
    import torch

    from scaletrain.model.build import build_model, trained_model_config

    # The same seed as the workers rebuilds the same base weights.
    torch.manual_seed(cfg.train.seed)
    trained = trained_model_config(cfg.model, cfg.train.stage)
    base = build_model(trained.model_copy(update={"finetuning_type": "full"}), Vocab.of(tokenizer),
                       cfg.data.label_names)
    if model_dir(cfg.model.name_or_path) is None:
        # A random-init built-in has no directory to load the base from: keep it beside the adapter, with the
        # tokenizer, and name it in the adapter's config so AutoPeftModelForCausalLM.from_pretrained(final) loads
        # offline (PEFT reads base_model_name_or_path; the built-in's name is no path it can open).
        base.save_pretrained(str(final / "base"))
        tokenizer.save_pretrained(str(final / "base"))
        adapter_config = final / "adapter_config.json"
        if adapter_config.is_file():
            settings = json.loads(adapter_config.read_text())
            settings["base_model_name_or_path"] = str((final / "base").resolve())
            adapter_config.write_text(json.dumps(settings, indent=2))
    if cfg.output.merge_lora:
        from peft import PeftModel

        merged = PeftModel.from_pretrained(base, str(final)).merge_and_unload()
        dtype = final_dtype(cfg.model, compute)
        merged.to(torch_dtype(dtype)).save_pretrained(str(final / "merged"))
        set_config_dtype(final / "merged", dtype)
        tokenizer.save_pretrained(str(final / "merged"))
        copy_processor_files(cfg.model.name_or_path, final / "merged")


def _quiet_libraries() -> None:
    """The driver's console is for scaletrain's lines; library chatter goes to the worker logs."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

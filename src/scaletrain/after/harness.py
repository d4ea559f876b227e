"""`scaletrain eval RUN_DIR|MODEL --tasks ...`: a run's model (or any model directory) through EleutherAI's
lm-evaluation-harness, offline like the rest of scaletrain.

What is evaluated: a LoRA run's adapter unmerged over its base (lm-eval's ``peft=``, the tokenizer and chat template
of ``final/``), a full fine-tune's ``final/``, or a model directory as given. Tasks are lm-eval's own names or
task YAMLs in ``--include-path`` (a task over a local JSONL: ``dataset_path: json`` with
``dataset_kwargs: {data_files: ...}``). The Hub is never asked: a task whose data is not on this machine (the HF
datasets cache, or local files) is one line naming what to fetch. The results (lm-eval's own JSON, plus what was
evaluated) go to ``RUN_DIR/eval/`` under a new name each time, never over an earlier file.

The harness is the library that exists for this (the numbers users compare with papers and leaderboards come from
it); this module only resolves what to evaluate and keeps the run directory's promises.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from scaletrain import envvars
from scaletrain.errors import ConfigError
from scaletrain.report.evals import EVAL_DIR, write_new
from scaletrain.rundir import RunDir

ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class Target:
    """What lm-eval loads: ``model_args`` for its ``hf`` model, and where the results go (None: printed only)."""
    model_args: dict
    described: str
    results_dir: Path | None


def target_of(path: str | Path, dtype: str = "auto") -> Target:
    """A run directory (its final/) or a model directory, as lm-eval's ``hf`` model arguments."""
    p = Path(path)
    if (p / RunDir.RESOLVED_CONFIG).is_file():
        return _run_target(RunDir(p).require_run(), dtype)
    if (p / "config.json").is_file():
        return Target({"pretrained": str(p), "dtype": dtype}, f"model {p}", None)
    raise ConfigError(f"eval {path}: neither a run directory ({RunDir.RESOLVED_CONFIG}) nor a model directory "
                      f"(config.json)")


def _run_target(run: RunDir, dtype: str) -> Target:
    import yaml

    final = run.final
    if not final.is_dir() or not any(final.iterdir()):
        raise ConfigError(f"{run.root}: no {RunDir.FINAL}/ (the run did not finish); eval reads a finished run's "
                          f"model (scaletrain train --resume {run.root} finishes it)")
    task = (yaml.safe_load(run.resolved_config.read_text()).get("model") or {}).get("task", "causal-lm")
    if task != "causal-lm":
        raise ConfigError(f"{run.root}: a {task} run; lm-evaluation-harness evaluates causal language models")
    results = run.root / EVAL_DIR
    if (final / ADAPTER_CONFIG).is_file():
        from scaletrain.after.export import base_dir

        base = base_dir(run, final)
        return Target({"pretrained": str(base), "peft": str(final), "tokenizer": str(final), "dtype": dtype},
                      f"{run.root.name}: LoRA adapter over {base}", results)
    return Target({"pretrained": str(final), "dtype": dtype}, f"{run.root.name}: {final}", results)


def task_manager(include_path: str | None, tasks: list[str] = ()):
    """lm-eval's task index. Indexing its ~15k built-in task YAMLs takes ~10-18 s here; tasks that are all plain
    tasks of ``include_path`` (no group, which may name built-in tasks) are looked up in that folder alone."""
    from lm_eval.tasks import TaskManager

    if include_path is None:
        return TaskManager()
    if not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {include_path}: not a directory of lm-eval task YAMLs")
    own = TaskManager(include_path=include_path, include_defaults=False)
    if tasks and all(name in own.all_subtasks for name in tasks):
        return own
    return TaskManager(include_path=include_path)


def check_tasks(names: list[str], manager) -> None:
    """Every task name known to lm-eval (or to --include-path), before a model is loaded."""
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=5)
            raise ConfigError(f"--tasks {name}: not an lm-eval task ({len(known)} known"
                              + (f"; close: {', '.join(close)}" if close else "")
                              + "); `lm-eval ls tasks` lists them, or pass --include-path DIR with its YAML")


def evaluate(path: str | Path, tasks: list[str], limit: float | None = None, num_fewshot: int | None = None,
             batch_size: int = 1, include_path: str | None = None, device: str | None = None,
             dtype: str = "auto") -> tuple[dict, Path | None]:
    """lm-eval's ``simple_evaluate`` on ``path``; the results and the file they were written to."""
    envvars.apply_defaults(envvars.EVAL_DEFAULTS)  # before datasets/transformers are imported: never the network
    try:
        import lm_eval
    except ImportError:
        raise ConfigError("scaletrain eval needs lm-evaluation-harness: pip install 'scaletrain[eval]'") from None
    if not tasks:
        raise ConfigError("--tasks: name at least one lm-eval task (e.g. --tasks arc_easy,hellaswag)")
    target = target_of(path, dtype)
    manager = task_manager(include_path, tasks)
    check_tasks(tasks, manager)
    import torch

    try:
        results = lm_eval.simple_evaluate(
            model="hf", model_args=target.model_args, tasks=tasks, limit=limit, num_fewshot=num_fewshot,
            batch_size=batch_size, device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
            task_manager=manager, log_samples=False)
    except (ConnectionError, OSError) as e:
        if "offline" in str(e).lower() or "connect" in str(e).lower() or "couldn't reach" in str(e).lower():
            raise ConfigError(f"--tasks {','.join(tasks)}: a task's data is not on this machine and scaletrain "
                              f"does not download ({str(e).splitlines()[0][:160]}); fetch it into the HF datasets "
                              f"cache on a machine with network (datasets.load_dataset), or write a task YAML over "
                              f"local files (--include-path)") from None
        raise
    if results is None:  # a rank other than 0 of a data-parallel evaluation (--workers): rank 0 has the results
        return {}, None
    results = {**results, "scaletrain": {"evaluated": target.described, "tasks": tasks, "limit": limit,
                                         "num_fewshot": num_fewshot}}
    written = write_new(results, target.results_dir, f"lm_eval-{'-'.join(tasks)[:80]}") \
        if target.results_dir else None
    return results, written

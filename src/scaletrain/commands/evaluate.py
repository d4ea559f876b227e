"""`scaletrain eval RUN_DIR|MODEL --tasks T1,T2 [--limit N]`: lm-evaluation-harness on a run's model (harness.py);
`--data FILE`: the generation eval on held-out prompts, BLEU-4 / ROUGE as LLaMA-Factory reports them (gen_eval.py)."""

from __future__ import annotations

import argparse

from scaletrain import envvars
from scaletrain.commands.args import COUNT, NONNEGATIVE, POSITIVE


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("eval", parents=parents, help="evaluate a run's model with lm-evaluation-harness (offline)")
    p.add_argument("target", help="a finished causal-LM run directory, or a model directory")
    p.add_argument("--tasks", help="lm-eval task names, comma-separated (e.g. arc_easy,hellaswag)")
    p.add_argument("--data", help="held-out conversations in the run's data format (any file training takes: JSON, "
                                  "JSON Lines, CSV, Parquet, ...; or dataset names of a dataset_info.json): each last "
                                  "reply generated and scored, BLEU-4 and ROUGE-1/2/L as LLaMA-Factory reports them")
    p.add_argument("--dataset-dir", help="with --data NAME[,NAME]: the folder of the dataset_info.json that names "
                                         "them (default: the run's data.dataset_dir)")
    p.add_argument("--max-new-tokens", type=COUNT, default=256, help="the longest generated answer (--data)")
    p.add_argument("--limit", type=POSITIVE, help="at most N documents per task (a fraction when below 1); with "
                                                  "--data, at most N records")
    p.add_argument("--num-fewshot", type=NONNEGATIVE, help="few-shot examples in each prompt (default: the task's)")
    p.add_argument("--batch-size", type=COUNT, default=1, help="lm-eval's batch size")
    p.add_argument("--include-path", help="a directory of lm-eval task YAMLs (tasks over local files)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: a GPU when there is one)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="the dtype the model is loaded in")
    p.add_argument("--workers", type=COUNT, default=1,
                   help="processes on this machine evaluating --tasks in data parallel (torchrun; lm-eval splits "
                        "the documents; on GPUs one per process); the metrics are the 1-process ones")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaletrain.errors import ConfigError

    if args.limit is not None and args.limit <= 0 or args.batch_size < 1 or args.max_new_tokens < 1:
        raise ConfigError("--limit must be > 0, --batch-size and --max-new-tokens >= 1")
    if not args.tasks and not args.data:
        raise ConfigError("eval: give --tasks (lm-eval tasks), --data FILE (the generation eval), or both")
    if args.data and args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit {args.limit:g}: with --data, a number of records (>= 1)")
    if args.workers < 1 or args.workers > 1 and not args.tasks:
        raise ConfigError(f"--workers {args.workers}: a count >= 1, for --tasks (the lm-eval tasks are split over "
                          f"the processes)")
    from scaletrain.console import console
    from scaletrain.report.evals import metric_rows

    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    outcomes = []
    if args.data:
        from scaletrain.after.gen_eval import generation_eval

        outcomes.append(generation_eval(args.target, args.data, limit=int(args.limit) if args.limit else None,
                                        max_new_tokens=args.max_new_tokens, dataset_dir=args.dataset_dir))
    if args.tasks and args.workers > 1 and not envvars.read(envvars.SCALETRAIN_EVAL_WORKER):
        rc = _data_parallel(args)
        if rc != 0:
            return rc
    elif args.tasks:
        from scaletrain.after.harness import evaluate

        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        outcomes.append(evaluate(args.target, tasks, limit=limit, num_fewshot=args.num_fewshot,
                                 batch_size=args.batch_size, include_path=args.include_path, device=args.device,
                                 dtype=args.dtype))
    for results, written in outcomes:
        for task, metric, value, stderr in metric_rows(results):
            print(f"{task}\t{metric}\t{value:.4f}" + (f"\t± {stderr:.4f}" if stderr is not None else ""))
        _said(written, console)
    return 0


def _data_parallel(args: argparse.Namespace) -> int:
    """``--workers N``: the lm-eval part run by N processes under torchrun (this command again in each, without
    --data); rank 0 prints and writes the results, as one process would."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}",
            "-m", "scaletrain", "eval", args.target, "--tasks", args.tasks, "--batch-size", str(args.batch_size),
            "--dtype", args.dtype]
    for flag, value in (("--limit", args.limit), ("--num-fewshot", args.num_fewshot),
                        ("--include-path", args.include_path), ("--device", args.device)):
        if value is not None:
            argv += [flag, str(value)]
    return subprocess.run(argv, env=envvars.eval_worker_env(args.workers)).returncode


def _said(written, console) -> None:
    if written:
        from scaletrain.report.markdown import write_report
        from scaletrain.rundir import RunDir

        run = written.parent.parent
        note = ""
        if (run / RunDir.REPORT).is_file():  # the run's report (train writes it at the end) shows its evaluations
            note = f"; {write_report(run)} updated"
        console.print(f"eval: results written to {written}{note}", soft_wrap=True)

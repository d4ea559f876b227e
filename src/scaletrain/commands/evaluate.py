"""`scaletrain eval RUN_DIR|MODEL --tasks T1,T2 [--limit N]`: lm-evaluation-harness on a run's model (harness.py)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("eval", parents=parents, help="evaluate a run's model with lm-evaluation-harness (offline)")
    p.add_argument("target", help="a finished causal-LM run directory, or a model directory")
    p.add_argument("--tasks", required=True, help="lm-eval task names, comma-separated (e.g. arc_easy,hellaswag)")
    p.add_argument("--limit", type=float, help="at most N documents per task (a fraction when below 1)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples in each prompt (default: the task's)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--include-path", help="a directory of lm-eval task YAMLs (tasks over local files)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: a GPU when there is one)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaletrain.errors import ConfigError

    if args.limit is not None and args.limit <= 0 or args.batch_size < 1:
        raise ConfigError("--limit must be > 0 and --batch-size >= 1")
    from scaletrain.console import console
    from scaletrain.harness import evaluate
    from scaletrain.report.evals import metric_rows

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    results, written = evaluate(args.target, tasks, limit=limit, num_fewshot=args.num_fewshot,
                                batch_size=args.batch_size, include_path=args.include_path, device=args.device,
                                dtype=args.dtype)
    for task, metric, value, stderr in metric_rows(results):
        print(f"{task}\t{metric}\t{value:.4f}" + (f"\t± {stderr:.4f}" if stderr is not None else ""))
    if written:
        from scaletrain.report.markdown import write_report
        from scaletrain.rundir import RunDir

        run = written.parent.parent
        note = ""
        if (run / RunDir.REPORT).is_file():  # the run's report (train writes it at the end) shows its evaluations
            note = f"; {write_report(run)} updated"
        console.print(f"eval: results written to {written}{note}", soft_wrap=True)
    return 0

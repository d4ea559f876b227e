"""`scaletrain report A B`: runs side by side (the settings that differ, how each went, every lm-eval metric any
of them has, the newest value of each); a run's own report shows its lm-eval results; comparison.md is never
replaced."""

import json
import time

import pytest

from scaletrain.cli import main
from scaletrain.report.compare import compare
from scaletrain.report.markdown import write_report


def _run(root, name, lr, workers, loss, finished=True, evals=()):
    run = root / name
    run.mkdir(parents=True)
    (run / "config.resolved.yaml").write_text(
        "model: {name_or_path: m, task: causal-lm, finetuning_type: lora}\n"
        f"train: {{strategy: ddp, per_device_train_batch_size: 2, gradient_accumulation_steps: 1, "
        f"learning_rate: {lr}}}\n"
        f"scaling: {{num_workers: {workers}}}\noutput: {{output_dir: {root}, run_name: {name}}}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"kind": "train", "step": 1, "train/loss": loss + 1.0, "perf/mfu": 0.30, "throughput/samples_per_s": 1.0},
        {"kind": "train", "step": 2, "train/loss": loss, "perf/mfu": 0.32, "throughput/samples_per_s": 1.0}]))
    if finished:
        (run / "summary.json").write_text(json.dumps({
            "steps": 2, "world_size": workers, "global_batch_size": 2 * workers, "train_time_s": 10.0 / workers,
            "eval_time_s": 1.0,
            "throughput/samples_per_s": 0.4 * workers, "goodput/ratio": 0.9, "final": {"eval/loss": loss - 0.1}}))
    for i, (task, acc) in enumerate(evals):
        (run / "eval").mkdir(exist_ok=True)
        path = run / "eval" / f"lm_eval-{task}-2026120{i}.json"
        path.write_text(json.dumps({"results": {task: {"alias": task, "acc,none": acc, "acc_stderr,none": 0.01}}}))
        time.sleep(0.01)  # the newest file's value wins
    return run


def test_runs_side_by_side_name_what_differs_and_every_metric(tmp_path):
    a = _run(tmp_path, "one-worker", 1e-4, 1, 2.0, evals=[("arc_easy", 0.50), ("arc_easy", 0.55)])
    b = _run(tmp_path, "two-workers", 2e-4, 2, 1.5, evals=[("hellaswag", 0.40)])
    c = _run(tmp_path, "still-going", 1e-4, 2, 3.0, finished=False)
    table = compare([a, b, c])
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table.splitlines()
            if line.startswith("| ")}
    assert rows[""][-1].rstrip(" |") == "still-going"
    assert "2 setting(s) differ (scaling.num_workers, train.learning_rate)" in table  # output.* is not a setting
    assert rows["train.learning_rate"] == ["0.0001", "0.0002", "0.0001 |"]
    assert rows["status"] == ["finished", "finished", "running or stopped |"]
    assert rows["train/loss (last)"] == ["2", "1.5", "3 |"]
    assert rows["eval/loss"] == ["1.9", "1.4", "- |"]
    assert rows["MFU (median)"] == ["0.32", "0.32", "0.32 |"]
    assert rows["arc_easy acc"] == ["0.55", "-", "- |"]  # the newer evaluation
    assert rows["hellaswag acc"] == ["-", "0.4", "- |"]


def test_the_command_prints_and_writes_a_comparison_never_over_one(tmp_path, capsys):
    a = _run(tmp_path / "runs", "a", 1e-4, 1, 2.0)
    b = _run(tmp_path / "runs", "b", 1e-4, 2, 2.0)
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr()
    assert "# scaletrain comparison: a, b" in out.out and "| scaling.num_workers | 1 | 2 |" in out.out
    assert (tmp_path / "cmp" / "comparison.md").read_text() == out.out
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "cmp")]) != 0
    assert "comparison.md exists there and is never replaced" in capsys.readouterr().err
    assert main(["report", str(a), str(tmp_path / "nothing")]) != 0
    assert "not a scaletrain run directory" in capsys.readouterr().err


def test_a_runs_report_shows_its_lm_eval_results(tmp_path):
    run = _run(tmp_path, "r", 1e-4, 1, 2.0, evals=[("arc_easy", 0.5), ("arc_easy", 0.625)])
    text = write_report(run).read_text()
    assert "## lm-evaluation-harness (scaletrain eval)" in text
    assert "| arc_easy | acc | 0.6250 | 0.0100 | lm_eval-arc_easy-20261201.json |" in text
    assert "lm-evaluation-harness" not in write_report(_run(tmp_path, "plain", 1e-4, 1, 2.0)).read_text()


@pytest.mark.parametrize("broken", ["{not json", ""])
def test_an_unreadable_eval_file_is_passed_over(tmp_path, broken):
    run = _run(tmp_path, "r", 1e-4, 1, 2.0, evals=[("arc_easy", 0.5)])
    (run / "eval" / "lm_eval-x-20261209.json").write_text(broken)
    assert "| arc_easy | acc | 0.5000 |" in write_report(run).read_text()

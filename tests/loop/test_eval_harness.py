"""`scaletrain eval` through lm-evaluation-harness, offline: a multiple-choice task written as an lm-eval task YAML
over a local JSONL (20 items), on a tiny Llama saved in bf16. The numbers equal lm-eval's own on the same model;
a LoRA run is evaluated unmerged (peft=) and gives the merged model's numbers; results are kept in the run and
never overwritten; an unknown task is one line before any model loads."""

import json

import pytest

from tests.cli import run_cli
from tests.conftest import lora_run_dir

pytestmark = pytest.mark.slow

TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """`scaletrain eval` sets lm-eval's offline variables in its process (HF_DATASETS_OFFLINE, ...: a command's
    process ends with it); here main() runs in the test's process, whose later runs' workers must not inherit them
    (a worker whose HF_ variables differ from the fork servers' starts plain: tests/conftest.py)."""
    import os

    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    words = ["red", "blue", "green", "cold", "warm", "north", "south", "up", "down", "left"]
    with open(d / "items.jsonl", "w") as f:
        for i in range(20):
            choices = [words[(i + k) % 10] for k in range(4)]
            f.write(json.dumps({"question": f"Which word comes {i % 4}th in {' '.join(choices)}?",
                                "choices": choices, "answer": i % 4}) + "\n")
    (d / "tiny_mc.yaml").write_text(TASK.format(data=d / "items.jsonl"))
    return d


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A run directory as a LoRA run leaves it: its base (a directory, bf16), final/ with the adapter and the
    tokenizer, config.resolved.yaml; and the merged model peft makes of it."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("eval")
    base, run, peft_model = lora_run_dir(root, lora_std=0.5)  # an adapter that changes the answers
    tok = AutoTokenizer.from_pretrained(base)
    merged = root / "merged"
    peft_model.merge_and_unload().save_pretrained(merged)
    tok.save_pretrained(merged)
    return base, run, merged


def _direct(model_dir, task_dir):
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(model_dir), "dtype": "auto"},
                                  tasks=["tiny_mc"], batch_size=1, device="cpu", log_samples=False,
                                  task_manager=TaskManager(include_path=str(task_dir), include_defaults=False))
    return out["results"]["tiny_mc"]


def test_eval_equals_lm_eval_and_a_lora_run_equals_its_merged_model(lora_run, task_dir, monkeypatch, capsys):
    from scaletrain.cli import main

    base, run, merged = lora_run
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["eval", str(base), "--tasks", "tiny_mc", "--include-path", str(task_dir)]) == 0
    printed = dict((line.split("\t")[1], float(line.split("\t")[2]))
                   for line in capsys.readouterr().out.splitlines() if line.startswith("tiny_mc\t"))
    direct = _direct(base, task_dir)
    assert printed == {"acc": pytest.approx(direct["acc,none"], abs=1e-4),
                       "acc_norm": pytest.approx(direct["acc_norm,none"], abs=1e-4)}

    # the adapter over the bf16 base in fp32, as the merged fp32 model holds it (in bf16 a close answer may flip)
    for extra in ([], ["--limit", "4"]):
        assert main(["eval", str(run), "--tasks", "tiny_mc", "--include-path", str(task_dir), "--dtype", "float32",
                     *extra]) == 0
    files = sorted((run / "eval").glob("lm_eval-tiny_mc-*.json"))
    assert len(files) == 2  # a second evaluation is a second file: nothing overwritten
    full, limited = (json.loads(f.read_text()) for f in files)
    if full["scaletrain"]["limit"] is not None:
        full, limited = limited, full
    assert "LoRA adapter over" in full["scaletrain"]["evaluated"] and limited["scaletrain"]["limit"] == 4
    assert full["results"]["tiny_mc"]["acc,none"] == pytest.approx(_direct(merged, task_dir)["acc,none"], abs=1e-6)
    assert full["results"]["tiny_mc"]["acc,none"] != pytest.approx(direct["acc,none"], abs=1e-6), \
        "the adapter was not applied: the base's numbers"


def test_an_unknown_task_and_a_run_without_final_are_one_line_each(lora_run, tmp_path, capsys):
    from scaletrain.cli import main

    base, run, _ = lora_run
    bad = run_cli("eval", base, "--tasks", "arc_easyy")
    assert bad.returncode != 0
    assert "--tasks arc_easyy: not an lm-eval task" in bad.stderr and "arc_easy" in bad.stderr, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.resolved.yaml").write_text(run.joinpath("config.resolved.yaml").read_text())
    assert main(["eval", str(unfinished), "--tasks", "tiny_mc"]) != 0
    assert "no final/ (the run did not finish)" in capsys.readouterr().err


def test_two_processes_give_the_one_process_numbers_in_one_file(lora_run, task_dir, tmp_path, capfd):
    """--workers 2: lm-eval's data-parallel split under torchrun; rank 0 prints and writes what one process does."""
    from scaletrain.cli import main

    base, run, _ = lora_run
    copy = tmp_path / "run"
    import shutil

    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    args = ["eval", str(copy), "--tasks", "tiny_mc", "--include-path", str(task_dir), "--dtype", "float32"]
    assert main(args) == 0
    one = capfd.readouterr().out
    assert main([*args, "--workers", "2"]) == 0
    two = capfd.readouterr().out
    rows = [sorted(line for line in out.splitlines() if line.startswith("tiny_mc\t")) for out in (one, two)]
    assert rows[0] == rows[1] and len(rows[0]) == 2  # acc and acc_norm, printed once (rank 0)
    files = sorted((copy / "eval").glob("lm_eval-tiny_mc-*.json"))
    assert len(files) == 2  # one file per evaluation, not one per process
    a, b = (json.loads(f.read_text())["results"]["tiny_mc"] for f in files)
    assert a["acc,none"] == b["acc,none"] and a["acc_norm,none"] == b["acc_norm,none"]
    assert main(["eval", str(copy), "--data", "x.jsonl", "--workers", "2"]) != 0
    assert "for --tasks" in capfd.readouterr().err


def test_tasks_of_the_include_path_alone_skip_lm_evals_own_index(task_dir):
    """Indexing lm-eval's ~15k built-in tasks takes seconds; tasks all in --include-path are looked up there alone,
    and a name that is not there (a built-in task) still finds lm-eval's index."""
    from scaletrain.after.harness import task_manager

    own = task_manager(str(task_dir), ["tiny_mc"])
    assert sorted(own.all_tasks) == ["tiny_mc"]
    both = task_manager(str(task_dir), ["tiny_mc", "arc_easy"])
    assert {"tiny_mc", "arc_easy"} <= set(both.all_tasks)

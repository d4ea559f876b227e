"""Bad input through the real CLI: one line naming the key/file and the fix, exit != 0, no traceback,
and no run directory created or touched. All of these fail before Ray starts."""

import json
import os

import pytest

from tests.cli import run_cli
from tests.conftest import write_config


def _assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def earlier_run(tmp_path):
    d = tmp_path / "runs" / "earlier"
    d.mkdir(parents=True)
    (d / "summary.json").write_text('{"keep": true}')
    return d


def _untouched(earlier_run):
    runs = earlier_run.parent
    assert [p.name for p in runs.iterdir()] == ["earlier"]
    assert json.loads((earlier_run / "summary.json").read_text()) == {"keep": True}


@pytest.mark.parametrize("mutate,needles", [
    (lambda c: c["train"].update(learnig_rate=1), ["unknown key 'train.learnig_rate'", "did you mean "
                                                                                       "'train.learning_rate'"]),
    (lambda c: c["train"].update(per_device_train_batch_size="big"),
     ["train.per_device_train_batch_size='big'", "valid integer"]),
    (lambda c: c["scaling"].update(num_workers=0), ["scaling.num_workers=0", "greater than or equal to 1"]),
    (lambda c: c["data"].update(train_file="/nonexistent/train.jsonl"),
     ["data.train_file=/nonexistent/train.jsonl", "file not found"]),
    (lambda c: c["data"].update(label_column="stars"), ["column 'stars' is missing", "set data.label_column"]),
    (lambda c: c["model"].update(name_or_path="meta-llama/Llama-3-8B"),
     ["model.name_or_path=meta-llama/Llama-3-8B", "never downloads", "huggingface-cli download"]),
    (lambda c: c["model"].update(name_or_path="/"), ["model.name_or_path=/ has no config.json", "model directory"]),
    # PEFT drops a misspelt target among good ones without a word; scaletrain names it before Ray starts.
    (lambda c: c["model"].update(finetuning_type="lora", lora_target=["query", "vallue"]),
     ["model.lora_target: vallue names no module", "linear layers are classifier, dense, key, query, value"]),
])
def test_bad_config_values(classify_cfg, tmp_path, earlier_run, mutate, needles):
    classify_cfg["output"]["output_dir"] = str(earlier_run.parent)
    mutate(classify_cfg)
    proc = run_cli("train", write_config(tmp_path / "c.yaml", classify_cfg))
    _assert_one_line_error(proc, *needles)
    _untouched(earlier_run)


def test_empty_data_file(classify_cfg, tmp_path, earlier_run):
    (tmp_path / "empty.jsonl").write_text("")
    classify_cfg["data"]["train_file"] = str(tmp_path / "empty.jsonl")
    classify_cfg["output"]["output_dir"] = str(earlier_run.parent)
    result = run_cli("train", write_config(tmp_path / "c.yaml", classify_cfg))
    _assert_one_line_error(result, "empty.jsonl", "no records")
    _untouched(earlier_run)


def test_malformed_yaml(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("model: {name_or_path: x\n")
    _assert_one_line_error(run_cli("train", p), "broken.yaml", "malformed YAML at line")


def test_bad_override(classify_cfg, tmp_path):
    p = write_config(tmp_path / "c.yaml", classify_cfg)
    _assert_one_line_error(run_cli("train", p, "scaling.num_workerz=2"), "unknown key 'scaling.num_workerz'")


def test_debug_shows_traceback_and_keeps_the_exit_code(classify_cfg, tmp_path):
    classify_cfg["train"]["strategy"] = "zero"
    path = write_config(tmp_path / "c.yaml", classify_cfg)
    plain, debug = run_cli("train", path), run_cli("train", path, "--debug")
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr
    assert plain.returncode == debug.returncode == 2  # ConfigError's code, not Python's 1 for an uncaught error
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()  # and the same one line at the end


def test_top_level_help_describes_the_tool():
    out = run_cli("--help").stdout
    assert "fine-tuning job from one device to many GPUs" in out and "entry point" not in out


def test_a_requested_stop_is_reported_as_a_stop_not_an_error(monkeypatch, capsys):
    from scaletrain import cli
    from scaletrain.errors import Interrupted

    def stop(args):
        raise Interrupted("at a checkpoint, as requested; continue with: scaletrain train --resume runs/x")

    monkeypatch.setattr(cli, "parse", lambda argv: __import__("argparse").Namespace(func=stop, debug=False))
    assert cli.main([]) == 130
    assert capsys.readouterr().err == ("stopped: at a checkpoint, as requested; continue with: "
                                       "scaletrain train --resume runs/x\n")


def test_resume_needs_a_run_dir(tmp_path):
    _assert_one_line_error(run_cli("train", "--resume", tmp_path), "--resume", "config.resolved.yaml")


def test_overrides_may_follow_options():
    from scaletrain.cli import parse

    args = parse(["train", "c.yaml", "a.b=1", "--no-progress", "scaling.num_workers=2"])
    assert args.config == "c.yaml" and args.no_progress
    assert args.overrides == ["a.b=1", "scaling.num_workers=2"]  # order kept: a later override wins
    assert parse(["scale", "c.yaml", "--workers", "1,2", "x.y=3"]).overrides == ["x.y=3"]


@pytest.mark.parametrize("argv", [["train", "c.yaml", "--no-progress", "--bogus"],
                                  ["train", "c.yaml", "--no-progress", "stray"],
                                  ["env", "a.b=1"]])  # env takes no overrides
def test_unknown_arguments_still_fail(argv, capsys):
    from scaletrain.cli import parse

    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needles", [
    (["parity", "--workers", "1"], ["argument --workers: 1: must be >= 2"]),  # each flag's range (commands/args.py)
    (["parity", "--workers", "2", "--steps", "0"], ["argument --steps: 0: must be >= 1"]),
    (["parity", "--workers", "2", "--tolerance", "-1"], ["argument --tolerance: -1: must be > 0"]),
    (["parity", "--workers", "3"], ["train.per_device_train_batch_size=8", "--workers 3"]),
    (["scale", "--workers", "1,2", "--breakdown-every", "-1"], ["argument --breakdown-every: -1: must be >= 0"]),
    (["scale", "--workers", "1,2,3", "--fixed-global-batch"], ["global batch 8", "3 workers"]),
])
def test_scale_and_parity_flags_fail_before_ray(classify_cfg, tmp_path, earlier_run, argv, needles):
    # Checked before Ray starts (~20 s here) or a run directory is made, not after the first world size ran.
    classify_cfg["output"]["output_dir"] = str(earlier_run.parent)
    cmd, *flags = argv
    proc = run_cli(cmd, write_config(tmp_path / "c.yaml", classify_cfg), *flags)
    _assert_one_line_error(proc, *needles)
    assert "Ray" not in proc.stderr  # Ray's start-up lines never appear
    _untouched(earlier_run)


def test_commbench_timeout_below_the_minimum():
    _assert_one_line_error(run_cli("commbench", "-n", "2", "--timeout", "0"), "argument --timeout: 0: must be >= 10")


def test_commbench_out_keeps_an_earlier_result(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "commbench.json").write_text("[]")
    _assert_one_line_error(run_cli("commbench", "-n", "2", "--out", out), f"--out {out} already holds commbench.json",
                           "pass a new directory")
    assert (out / "commbench.json").read_text() == "[]"


@pytest.mark.parametrize("flags,needle", [
    (["--step-time", "0"], "argument --step-time: 0: must be > 0"),  # each flag's range (commands/args.py)
    (["--grad-bytes", "-5"], "argument --grad-bytes: -5: must be > 0"),
    (["--bucket-mb", "0"], "argument --bucket-mb: 0: must be > 0"),  # divided by zero with a traceback before
    (["--gpus-per-node", "0"], "argument --gpus-per-node: 0: must be >= 1"),
    (["--param-bytes", "-1"], "argument --param-bytes: -1: must be >= 0"),
    (["--gpus", "0,2"], "--gpus 0,2: world sizes must be >= 1"),
])
def test_predict_numbers_out_of_range(flags, needle):
    base = {"--step-time": "0.5", "--grad-bytes": "1e9", "--profile": "mi300x"}
    base.update(dict(zip(flags[::2], flags[1::2])))
    _assert_one_line_error(run_cli("predict", *[x for kv in base.items() for x in kv]), needle)


def test_debug_tracebacks_are_redacted_too(monkeypatch, capsys):
    import argparse

    from scaletrain import cli
    from scaletrain.errors import ConfigError

    monkeypatch.setenv("HF_TOKEN", "hf_DebugTokenAbcdefghijklmnop")

    def fail(args):
        raise ConfigError("could not reach the hub with hf_DebugTokenAbcdefghijklmnop (Bearer "
                          "sk-live-0123456789abcdef)")

    monkeypatch.setattr(cli, "parse", lambda argv: argparse.Namespace(func=fail, debug=True))
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "raise ConfigError" in err
    assert "DebugToken" not in err and "sk-live" not in err and err.count("***") >= 2


@pytest.mark.parametrize("data,needles", [
    ({"template": "llama-3"}, ["data.template=llama-3 is not a template", "did you mean llama3"]),
    ({"formatting": "alpaca", "train_file": "CHAT"}, ["records hold conversations", "data.formatting=sharegpt"]),
    ({"formatting": "sharegpt", "train_file": "CHAT", "messages_column": "turns"},
     ["column 'turns' is missing", "set data.messages_column"]),
    ({"dataset_dir": "DIR", "dataset": ["nope"], "train_file": None}, ["data.dataset: nope is not in",
                                                                       "dataset_info.json"]),
])
def test_bad_chat_data_input(demo_dir, tmp_path, earlier_run, data, needles):
    (tmp_path / "lf").mkdir()
    (tmp_path / "lf" / "dataset_info.json").write_text('{"chat": {"file_name": "chat.jsonl"}}')
    cfg = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
           "data": {"train_file": str(demo_dir / "alpaca.json"), "max_length": 64},
           "output": {"output_dir": str(earlier_run.parent)}}
    for k, v in data.items():
        v = {"CHAT": str(demo_dir / "chat.jsonl"), "DIR": str(tmp_path / "lf")}.get(v, v) if isinstance(v, str) else v
        if v is None:
            cfg["data"].pop(k)
        else:
            cfg["data"][k] = v
    _assert_one_line_error(run_cli("train", write_config(tmp_path / "c.yaml", cfg)), *needles)
    _untouched(earlier_run)


def test_alpaca_data_with_the_default_task_says_to_set_causal_lm(demo_dir, tmp_path, earlier_run):
    cfg = {"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": str(demo_dir / "alpaca.json")},
           "output": {"output_dir": str(earlier_run.parent)}}
    _assert_one_line_error(run_cli("train", write_config(tmp_path / "c.yaml", cfg)), "column 'text' is missing",
                           "set model.task=causal-lm")
    _untouched(earlier_run)


def test_resume_with_every_checkpoint_corrupt_is_an_error_naming_them(classify_cfg, tmp_path, capsys):
    import json

    from scaletrain import cli
    from tests.conftest import write_config

    run = tmp_path / "runs" / "broken"
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    (run / "checkpoints" / "step-8").mkdir()
    (run / "checkpoints" / "step-8" / "manifest.json").write_text(json.dumps({"files": {"model.pt": "0" * 64}}))
    classify_cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": "broken"}
    write_config(run / "config.resolved.yaml", classify_cfg)
    before = sorted(p.name for p in run.rglob("*"))
    assert cli.main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint can be resumed from (step-8: model.pt is missing; step-4: no manifest (partial write))" in err
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written: no metrics appended from step 0


def test_a_fallback_past_a_broken_checkpoint_is_said(tmp_path):
    import json

    from scaletrain.launch.job import _resume_notes

    run = tmp_path / "run"
    good = run / "checkpoints" / "step-4"
    good.mkdir(parents=True)
    (good / "manifest.json").write_text(json.dumps({"files": {}}))
    (run / "checkpoints" / "step-8").mkdir()
    assert _resume_notes(run) == ["resuming from step-4: the newer checkpoint(s) are unusable (step-8: no manifest "
                                  "(partial write))"]


def _rows_file(path, lines):
    path.write_text("\n".join(ln if isinstance(ln, str) else json.dumps(ln) for ln in lines))
    return path


def _bert_dir(tmp_path, name: str = "bert", **config):
    """A tiny BERT classifier saved as a local model directory with MiniLM's tokenizer (``config``: BertConfig's
    keys over the defaults, e.g. num_labels)."""
    from transformers import BertConfig, BertForSequenceClassification

    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin:tiny-bert")
    d = tmp_path / name
    BertForSequenceClassification(BertConfig(**{"vocab_size": len(tok), "hidden_size": 32, "num_hidden_layers": 1,
                                                "num_attention_heads": 2, "intermediate_size": 64,
                                                "max_position_embeddings": 512, **config})).save_pretrained(d)
    tok.save_pretrained(d)
    return d


GOOD = [{"text": f"good movie {i}", "label": i % 2} for i in range(400)]


@pytest.mark.parametrize("case", ["malformed line", "latin-1", "max_length", "truncated weights", "eval label"])
def test_bad_data_content_fails_before_ray_with_one_line(classify_cfg, tmp_path, earlier_run, case):
    """The rows of the data-guard issue's table that are errors: one line, seconds, no run directory."""
    classify_cfg["output"]["output_dir"] = str(earlier_run.parent)
    data = classify_cfg["data"]
    if case == "malformed line":
        lines = [json.dumps(r) for r in GOOD]
        lines[333] = lines[333][:-4]
        data["train_file"] = str(_rows_file(tmp_path / "d.jsonl", lines))
        needles = ["d.jsonl: line 334 is not JSON", "fix or remove that line"]
    elif case == "latin-1":
        p = tmp_path / "d.jsonl"
        p.write_bytes("\n".join(json.dumps({"text": "crème brûlée" if i == 9 else r["text"], "label": r["label"]},
                                           ensure_ascii=False) for i, r in enumerate(GOOD)).encode("latin-1"))
        data["train_file"] = str(p)
        needles = ["d.jsonl: line 10 is not UTF-8", "set data.encoding=cp1252", "iconv -f cp1252 -t utf-8"]
    elif case == "max_length":
        data["max_length"] = 3000
        needles = ["data.max_length=3000 is beyond the 512 positions", "set data.max_length (cutoff_len) to 512"]
    elif case == "truncated weights":
        d = _bert_dir(tmp_path)
        w = d / "model.safetensors"
        w.write_bytes(w.read_bytes()[:-1000])
        classify_cfg["model"]["name_or_path"] = str(d)
        needles = ["model.safetensors is damaged", "download the model again"]
    else:
        data["train_file"] = str(_rows_file(tmp_path / "t.jsonl", [{"text": f"t {i}", "label": ["neg", "pos"][i % 2]}
                                                                   for i in range(40)]))
        data["eval_file"] = str(_rows_file(tmp_path / "e.jsonl", [{"text": "x", "label": "pos"},
                                                                  {"text": "y", "label": "meh"}]))
        classify_cfg["model"].pop("num_labels")
        needles = ["e.jsonl: label 'meh' (record 2) is not in the training data (neg, pos)"]
    proc = run_cli("train", write_config(tmp_path / "c.yaml", classify_cfg))
    _assert_one_line_error(proc, *needles)
    _untouched(earlier_run)


def _wide_doctor(config):
    return run_cli("doctor", config, "--no-smoke", env={**os.environ, "COLUMNS": "1000"})


def test_doctor_runs_the_data_checks_of_train(classify_cfg, tmp_path):
    lines = [*GOOD[:100], [1, 2], {"text": None, "label": 1}, {"text": "fine", "label": 0.7}, *GOOD[100:]]
    classify_cfg["data"]["train_file"] = str(_rows_file(tmp_path / "d.jsonl", lines))
    proc = _wide_doctor(write_config(tmp_path / "c.yaml", classify_cfg))
    row = next(ln for ln in proc.stderr.splitlines() if "data content" in ln)
    assert proc.returncode == 0 and "│ warn " in row, proc.stderr
    for needle in ("a JSON array instead of an object (line 101)", "empty or missing 'text' (line 102)",
                   "label 0.7 is not a whole class number", "320 train / 80 eval"):  # 400 good records
        assert needle in row, row
    classify_cfg["data"]["max_length"] = 3000
    proc = _wide_doctor(write_config(tmp_path / "c.yaml", classify_cfg))
    row = next(ln for ln in proc.stderr.splitlines() if "data content" in ln)
    assert proc.returncode == 1 and "│ fail " in row and "beyond the 512 positions" in row

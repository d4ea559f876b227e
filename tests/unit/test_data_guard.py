"""Bad data content is named or counted, never trained on silently: label names, JSON lines that are not
records, parse errors with the file's own line, encodings, and the model checks the driver runs before Ray."""

import json
import struct
from pathlib import Path

import pytest

from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.errors import ConfigError, DataError
from scaletrain.model.build import check_model
from scaletrain.model.tokenizer import load_tokenizer

WORDS = {"positive": "great fine love wonderful", "negative": "awful bad hate boring"}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tiny-bert")


def _rows(n, names=("negative", "positive")):
    return [{"text": f"{WORDS.get(names[i % len(names)], 'so so')} {i}", "label": names[i % len(names)]}
            for i in range(n)]


def _write(path: Path, rows, encoding="utf-8") -> Path:
    path.write_bytes("\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)
                               for r in rows).encode(encoding))
    return path


def _cfg(tmp_path, data, model=None):
    return validate({"model": {"name_or_path": "builtin:tiny-bert", **(model or {})},
                     "data": {"eval_ratio": 0.2, "max_length": 32, **data},
                     "output": {"output_dir": str(tmp_path / "runs")}})


def test_string_labels_are_sorted_classes_and_num_labels_follows_them(tmp_path, tokenizer):
    p = _write(tmp_path / "d.jsonl", _rows(40))
    cfg = _cfg(tmp_path, {"train_file": str(p)})
    data = prepare_data(cfg, tokenizer)
    resolved = data.resolve(cfg)
    assert resolved.model.num_labels == 2 and resolved.data.label_names == ["negative", "positive"]
    by_text = {r["text"]: r["label"] for r in _rows(40)}
    decoded = {tokenizer.decode(ex["input_ids"], skip_special_tokens=True): ex["labels"] for ex in data.train}
    for text, label in decoded.items():  # negative -> 0, positive -> 1, every record
        assert label == ["negative", "positive"].index(by_text[text])
    # data.label_names fixes the order; the ids follow it
    fixed = prepare_data(_cfg(tmp_path, {"train_file": str(p), "label_names": ["positive", "negative"]}), tokenizer)
    assert {ex["labels"] for ex in fixed.train} == {0, 1}
    assert [ex["labels"] for ex in fixed.train] == [1 - ex["labels"] for ex in data.train]


def test_label_set_errors_name_the_label_both_numbers_and_the_fix(tmp_path, tokenizer):
    p = _write(tmp_path / "d.jsonl", _rows(30, ("negative", "positive", "neutral")))
    with pytest.raises(DataError, match=r"model.num_labels=2 but the training data has 3 classes \(negative, "
                                        r"neutral, positive\); remove model.num_labels"):
        prepare_data(_cfg(tmp_path, {"train_file": str(p)}, {"num_labels": 2}), tokenizer)
    with pytest.raises(DataError, match=r"d.jsonl: label 'neutral' \(record 3\) is not in data.label_names"):
        prepare_data(_cfg(tmp_path, {"train_file": str(p), "label_names": ["negative", "positive"]}), tokenizer)
    train = _write(tmp_path / "t.jsonl", _rows(30))
    ev = _write(tmp_path / "e.jsonl", _rows(4) + [{"text": "meh", "label": "neutral"}])
    with pytest.raises(DataError, match=r"data.eval_file=.*e.jsonl: label 'neutral' \(record 5\) is not in the "
                                        r"training data \(negative, positive\)"):
        prepare_data(_cfg(tmp_path, {"train_file": str(train), "eval_file": str(ev)}), tokenizer)
    with pytest.raises(ConfigError, match="names positive more than once"):
        _cfg(tmp_path, {"train_file": str(train), "label_names": ["positive", "positive"]})


def test_a_number_among_class_names_is_skipped_and_counted(tmp_path, tokenizer):
    p = _write(tmp_path / "d.jsonl", _rows(199) + [{"text": "odd", "label": 1}])
    data = prepare_data(_cfg(tmp_path, {"train_file": str(p)}), tokenizer)
    assert len(data.train) + len(data.eval) == 199
    assert any("label 1 is a number among class names (line 200)" in n for n in data.notes), data.notes


def test_json_lines_that_are_not_objects_are_skipped_with_their_line(tmp_path, tokenizer):
    rows = [{"text": f"good {i}", "label": i % 2} for i in range(300)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(50, "[1, 2]")
    lines.insert(120, "")  # a blank line: not a record, not counted
    lines.insert(200, '"just a string"')
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines))
    data = prepare_data(_cfg(tmp_path, {"train_file": str(p)}), tokenizer)
    assert len(data.train) + len(data.eval) == 300
    notes = " ".join(data.notes)
    assert "a JSON array instead of an object (line 51)" in notes
    assert "a JSON string instead of an object (line 201)" in notes
    assert sum(data.skipped.values()) == 2
    with pytest.raises(DataError, match=r"2 of 302 records cannot be trained on .*the first is line 51: a JSON array"):
        prepare_data(_cfg(tmp_path, {"train_file": str(p), "max_bad_ratio": 0.005}), tokenizer)


def test_skipped_records_name_the_file_line_past_blank_lines(tmp_path, tokenizer):
    rows = [json.dumps({"text": f"good {i}", "label": i % 2}) for i in range(200)]
    rows.insert(10, "")
    rows.insert(11, "")
    rows.append(json.dumps({"text": None, "label": 1}))
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(rows))
    data = prepare_data(_cfg(tmp_path, {"train_file": str(p)}), tokenizer)
    assert any("empty or missing 'text' (line 203)" in n for n in data.notes), data.notes


def test_a_malformed_line_deep_in_the_file_is_named_by_its_line(tmp_path, tokenizer):
    rows = [json.dumps({"text": f"good {i}", "label": i % 2}) for i in range(5000)]
    rows[4321] = rows[4321][:-5]
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(rows))
    with pytest.raises(DataError, match=r"d.jsonl: line 4322 is not JSON \(.* at column \d+\); fix or remove"):
        prepare_data(_cfg(tmp_path, {"train_file": str(p)}), tokenizer)
    whole = tmp_path / "w.json"
    whole.write_text("[\n" + ",\n".join(rows[:10]) + ",\n{\"text\": }\n]")
    with pytest.raises(DataError, match=r"w.json: line 12 is not JSON"):
        prepare_data(_cfg(tmp_path, {"train_file": str(whole)}), tokenizer)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_latin1_file_names_its_encoding_and_trains_with_data_encoding(tmp_path, tokenizer, suffix):
    rows = [{"text": f"café crème {i}" if i == 70 else f"good {i}", "label": i % 2} for i in range(100)]
    p = tmp_path / f"d{suffix}"
    if suffix == ".csv":
        p.write_bytes(("text,label\n" + "\n".join(f"{r['text']},{r['label']}" for r in rows)).encode("latin-1"))
        line = 72
    else:
        _write(p, rows, "latin-1")
        line = 71
    with pytest.raises(DataError, match=rf"d{suffix}: line {line} is not UTF-8 .*it looks like cp1252: set "
                                        rf"data.encoding=cp1252, or convert the file: iconv -f cp1252"):
        prepare_data(_cfg(tmp_path, {"train_file": str(p)}), tokenizer)
    data = prepare_data(_cfg(tmp_path, {"train_file": str(p), "encoding": "latin-1"}), tokenizer)
    texts = [tokenizer.decode(ex["input_ids"], skip_special_tokens=True) for ex in [*data.train, *data.eval]]
    assert any("cafe" in t or "café" in t for t in texts)  # read as the characters it holds (MiniLM lowercases
    assert len(texts) == 100                                 # and strips accents), not as replacement bytes
    with pytest.raises(ConfigError, match="data.encoding.*'klingon' is not a text encoding"):
        _cfg(tmp_path, {"train_file": str(p), "encoding": "klingon"})


def test_regression_targets_must_be_finite(tmp_path, tokenizer):
    rows = [{"text": f"good {i}", "label": i / 10} for i in range(199)] + ['{"text": "x", "label": NaN}']
    p = _write(tmp_path / "d.jsonl", rows)
    data = prepare_data(_cfg(tmp_path, {"train_file": str(p)}, {"num_labels": 1}), tokenizer)
    assert len(data.train) + len(data.eval) == 199
    assert any("label nan is not a finite number (line 200)" in n for n in data.notes), data.notes


def _model_dir(tmp_path: Path, positions=64, vocab=None, tokenizer=None) -> Path:
    """A tiny BERT saved as a local HF directory (safetensors), from a config."""
    from transformers import BertConfig, BertForSequenceClassification

    d = tmp_path / "model"
    config = BertConfig(vocab_size=vocab or len(tokenizer), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=positions)
    BertForSequenceClassification(config).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def test_model_checks_before_launch(tmp_path, tokenizer):
    d = _model_dir(tmp_path, positions=64, tokenizer=tokenizer)
    cfg = validate({"model": {"name_or_path": str(d)}, "data": {"train_file": "x.jsonl"}})
    check_model(cfg.model, tokenizer, 64)
    with pytest.raises(ConfigError, match=r"data.max_length=3000 is beyond the 64 positions of .*"
                                          r"max_position_embeddings\); set data.max_length \(cutoff_len\) to 64"):
        check_model(cfg.model, tokenizer, 3000)
    weights = d / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # a copy that stopped half way
    with pytest.raises(ConfigError, match=r"model.safetensors is damaged \(it has \d+ bytes but its header "
                                          r"describes \d+.*download the model again"):
        check_model(cfg.model, tokenizer, 64)
    weights.write_bytes(whole[:100])  # the header itself cut
    with pytest.raises(ConfigError, match=r"model.safetensors is damaged \(its header is cut short"):
        check_model(cfg.model, tokenizer, 64)
    weights.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(ConfigError, match=r"its header is unreadable"):
        check_model(cfg.model, tokenizer, 64)
    weights.write_bytes(whole)
    check_model(cfg.model, tokenizer, 64)


def test_a_tokenizer_beyond_the_model_vocabulary_is_named(tmp_path, tokenizer):
    d = _model_dir(tmp_path, vocab=1000, tokenizer=tokenizer)
    cfg = validate({"model": {"name_or_path": str(d)}, "data": {"train_file": "x.jsonl"}})
    with pytest.raises(ConfigError, match=rf"its tokenizer has {len(tokenizer)} tokens but the model's vocabulary "
                                          r"has 1000 \(config.json vocab_size\)"):
        check_model(cfg.model, tokenizer, 32)


def test_the_non_finite_loss_advice_fits_the_cause_and_names_a_checkpoint_only_if_one_exists(tmp_path):
    from scaletrain.worker.step_check import non_finite_loss

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    quiet = lambda *a: None
    plain = str(non_finite_loss(str(run), 3, float("nan"), 0, quiet, step_tokens=120))
    assert "lower train.learning_rate" in plain and "no checkpoint was saved before it" in plain
    assert "intact" not in plain
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    data = str(non_finite_loss(str(run), 3, float("nan"), 0, quiet, step_tokens=0))
    assert "hold no target token" in data and "data.max_length (cutoff_len)" in data
    assert "the last checkpoint, step-2, is intact: scaletrain train --resume" in data


def test_placeholder_text_in_targets_is_warned_with_the_count(tmp_path):
    tok = load_tokenizer("builtin:tiny-llama")
    rows = [{"instruction": "hi", "input": "", "output": "I am {{name}}, made by {{author}}." if i < 7 else "ok"}
            for i in range(40)]
    p = _write(tmp_path / "identity.json", [])
    p.write_text(json.dumps(rows))
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(p), "template": "chatml"}, "output": {"output_dir": str(tmp_path)}})
    notes = " ".join(prepare_data(cfg, tok).notes)
    assert "warning: data.train_file: 7 record(s) hold placeholder text in their targets ({{author}}, {{name}}; " \
           "first at record 1)" in notes


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.loop
def test_string_label_classification_end_to_end_pipeline_returns_the_names(tmp_path):
    """Trains on names, and final/ loads into a transformers pipeline that prints them."""
    from transformers import pipeline

    from scaletrain.launch.job import finish_final
    from scaletrain.launch.local import run_in_process
    from tests.conftest import local_spec

    rows = [{"text": f"{WORDS[['negative', 'positive'][i % 2]]} {i}", "label": ["negative", "positive"][i % 2]}
            for i in range(160)]
    p = _write(tmp_path / "d.jsonl", rows)
    cfg_dict = {"model": {"name_or_path": "builtin:tiny-bert", "task": "sequence-classification"},
                "data": {"train_file": str(p), "eval_ratio": 0.2, "max_length": 16},
                "train": {"per_device_train_batch_size": 16, "learning_rate": 2e-3, "max_steps": 30, "seed": 1,
                          "warmup_ratio": 0.0}}
    cfg, tok, spec = local_spec(cfg_dict, tmp_path / "run")
    assert cfg.model.num_labels == 2 and cfg.data.label_names == ["negative", "positive"]
    summary = run_in_process(spec)
    finish_final(cfg, tmp_path / "run", tok)
    assert summary["final"]["eval/accuracy"] > 0.9
    classify = pipeline("text-classification", model=str(tmp_path / "run" / "final"), device="cpu")
    out = classify(["awful bad hate boring", "great fine love wonderful"])
    assert [o["label"] for o in out] == ["negative", "positive"]
    import yaml

    from scaletrain.report.markdown import write_report

    (tmp_path / "run" / "config.resolved.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))  # as the driver
    assert "| classes | 0 = negative, 1 = positive |" in write_report(tmp_path / "run").read_text()


def test_missing_example_data_says_how_to_generate_it(tmp_path):
    from scaletrain.data.sources import load

    missing = tmp_path / "examples" / "data" / "alpaca.json"
    with pytest.raises(DataError, match=r"examples/data/alpaca.json: file not found; it is example data scaletrain "
                                        r"generates: python -m scaletrain.data.demo .*examples/data \(make demo"):
        load(str(missing), "auto", "data.train_file", str(tmp_path))
    with pytest.raises(DataError, match=r"mine.jsonl: file not found; check the path"):
        load(str(tmp_path / "mine.jsonl"), "auto", "data.train_file", str(tmp_path))


def test_a_full_disk_under_the_monitor_is_one_warning_not_a_thread_traceback(tmp_path, monkeypatch):
    """alerts.jsonl (or a sink) that cannot be written: the monitor thread says so once and goes on."""
    import threading
    import time as _time

    from scaletrain.config.schema import MonitorConfig
    from scaletrain.metrics.monitor import RunMonitor

    class Console:
        def __init__(self):
            self.lines = []

        def print(self, text, **kw):
            self.lines.append(text)

    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args))
    console = Console()
    mon = RunMonitor(tmp_path, MonitorConfig(), console=console, poll_s=0.05)

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "alerts.jsonl"))

    mon.poll = full
    with mon:
        _time.sleep(0.4)
    assert errors == []
    warnings = [ln for ln in console.lines if "the monitor cannot write" in ln]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]

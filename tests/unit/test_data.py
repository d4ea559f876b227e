import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, Collator, prepare_data, read_records
from scaletrain.errors import DataError
from scaletrain.model import MINILM_VOCAB_SIZE, load_tokenizer
from scaletrain.worker.sampler import ResumableSampler

ROWS = [{"text": f"movie {i} was {'great' if i % 2 else 'awful'}", "label": i % 2} for i in range(20)]


@pytest.fixture(scope="module")
def tokenizer():
    tok = load_tokenizer("builtin:tiny-bert")
    assert len(tok) == MINILM_VOCAB_SIZE  # not the 5-token vocab a vocab_file-only load gives
    return tok


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv", ".parquet"])
def test_read_all_formats(tmp_path, suffix):
    p = tmp_path / f"d{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps(ROWS))
    elif suffix == ".jsonl":
        p.write_text("\n".join(json.dumps(r) for r in ROWS))
    elif suffix == ".csv":
        p.write_text("text,label\n" + "\n".join(f"{r['text']},{r['label']}" for r in ROWS))
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), p)
    rows = read_records(str(p))
    assert len(rows) == 20 and rows[3]["text"] == "movie 3 was great" and int(rows[3]["label"]) == 1


def test_missing_empty_and_unknown_files(tmp_path):
    with pytest.raises(DataError, match=r"data.train_file=.*nope.jsonl: file not found"):
        read_records(str(tmp_path / "nope.jsonl"))
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="has no records"):
        read_records(str(tmp_path / "e.jsonl"))
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match="set data.format"):
        read_records(str(tmp_path / "d.txt"))
    (tmp_path / "bad.jsonl").write_text("{not json")
    with pytest.raises(DataError, match="cannot parse as jsonl"):
        read_records(str(tmp_path / "bad.jsonl"))


def _cfg(path, **model):
    return validate({"model": {"name_or_path": "builtin:tiny-bert", **model},
                     "data": {"train_file": str(path), "eval_ratio": 0.25, "max_length": 64}})


def test_classification_split_and_missing_column(tmp_path, tokenizer):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in ROWS))
    data = prepare_data(_cfg(p), tokenizer)
    assert len(data.train) == 15 and len(data.eval) == 5
    assert data.train[0]["input_ids"][0] == tokenizer.cls_token_id and data.train[0]["labels"] in (0, 1)
    again = prepare_data(_cfg(p), tokenizer)
    assert again.eval == data.eval  # the held-out split is seeded
    cfg = validate({**_cfg(p).model_dump(), "data": {"train_file": str(p), "label_column": "sentiment"}})
    with pytest.raises(DataError, match=r"column 'sentiment' is missing \(columns: label, text\); set data.label_column"):
        prepare_data(cfg, tokenizer)


def test_label_out_of_range(tmp_path, tokenizer):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps({"text": "x", "label": 5}) for _ in range(4)))
    with pytest.raises(DataError, match=r"label 5 is outside \[0, 2\); set model.num_labels"):
        prepare_data(_cfg(p), tokenizer)


def test_sft_loss_only_on_response(tmp_path, tokenizer):
    p = tmp_path / "a.json"
    p.write_text(json.dumps([{"instruction": "Opposite of hot?", "input": "", "output": "cold"}] * 4))
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(p), "eval_ratio": 0.25}})
    ex = prepare_data(cfg, tokenizer).train[0]
    answer = tokenizer("cold", add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
    n_prompt = len(ex["input_ids"]) - len(answer)
    assert ex["labels"][:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert ex["labels"][n_prompt:] == answer == ex["input_ids"][n_prompt:]


def test_collator_pads_and_masks():
    batch = Collator(pad_token_id=0)([{"input_ids": [5, 6, 7], "labels": [1, 2, 3]}, {"input_ids": [8], "labels": [4]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[1, 2, 3], [4, IGNORE_INDEX, IGNORE_INDEX]]
    cls = Collator(0)([{"input_ids": [1], "labels": 1}, {"input_ids": [2, 3], "labels": 0}])
    assert cls["labels"].dtype == torch.long and cls["labels"].tolist() == [1, 0]


def test_sampler_partitions_and_resumes():
    s0, s1 = ResumableSampler(10, 2, 0, seed=3), ResumableSampler(10, 2, 1, seed=3)
    a, b = list(s0), list(s1)
    assert len(a) == len(b) == 5 and not set(a) & set(b)
    s0.set_position(0, 2)
    assert list(s0) == a[2:] and len(s0) == 3
    s0.set_position(1, 0)
    assert list(s0) != a  # a new shuffle each epoch


def test_demo_reviews_feed_the_scale_config_with_64_token_examples(tmp_path, tokenizer, monkeypatch):
    from pathlib import Path

    from scaletrain.config import load_config
    from scaletrain.demo_data import NEGATIVE, POSITIVE, write_demo_data

    out = write_demo_data(tmp_path, n_sentiment=10, n_alpaca=10, n_reviews=50)
    rows = [json.loads(line) for line in (out / "reviews.jsonl").read_text().splitlines()]
    assert len(rows) == 50
    for r in rows:  # six sentences, every sentiment word of the review's own label
        assert r["text"].count(".") >= 6
        words = {w.strip(".,;:") for w in r["text"].split()}
        assert words & set(POSITIVE if r["label"] else NEGATIVE) and not words & set(NEGATIVE if r["label"] else POSITIVE)
    monkeypatch.setenv("DEMO_DATA", str(out))
    cfg = load_config(Path(__file__).parents[2] / "examples" / "scale_lora.yaml", [])
    assert cfg.model.finetuning_type == "lora" and cfg.data.max_length == 64
    data = prepare_data(cfg, tokenizer)
    lengths = [len(ex["input_ids"]) for ex in data.train]
    assert max(lengths) == 64 and sum(lengths) / len(lengths) > 56  # mostly full 64-token sequences

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, Collator, prepare_data
from scaletrain.data.sources import load
from scaletrain.errors import DataError
from scaletrain.model.files import MINILM_VOCAB_SIZE
from scaletrain.model.tokenizer import load_tokenizer
from scaletrain.worker.sampler import ResumableSampler

ROWS = [{"text": f"movie {i} was {'great' if i % 2 else 'awful'}", "label": i % 2} for i in range(20)]


@pytest.fixture(scope="module")
def tokenizer():
    tok = load_tokenizer("builtin:tiny-bert")
    assert len(tok) == MINILM_VOCAB_SIZE  # not the 5-token vocab a vocab_file-only load gives
    return tok


def read_records(path, fmt="auto", key="data.train_file"):
    return load(path, fmt, key, hf_cache=str(Path(path).parent / ".hf")).ds.to_list()


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv", ".parquet", ".arrow", "/"])
def test_read_all_formats(tmp_path, suffix):
    import datasets

    p = tmp_path / f"d{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps(ROWS))
    elif suffix == ".jsonl":
        p.write_text("\n".join(json.dumps(r) for r in ROWS))
    elif suffix == ".csv":
        p.write_text("text,label\n" + "\n".join(f"{r['text']},{r['label']}" for r in ROWS))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), p)
    elif suffix == ".arrow":
        with pa.ipc.new_stream(p, pa.Table.from_pylist(ROWS).schema) as w:
            w.write_table(pa.Table.from_pylist(ROWS))
    else:
        datasets.Dataset.from_list(ROWS).save_to_disk(str(p))
    rows = read_records(str(p))
    assert len(rows) == 20 and rows[3]["text"] == "movie 3 was great" and int(rows[3]["label"]) == 1


def test_missing_empty_and_unknown_files(tmp_path):
    with pytest.raises(DataError, match=r"data.train_file=.*nope.jsonl: file not found"):
        read_records(str(tmp_path / "nope.jsonl"))
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="has no records"):
        read_records(str(tmp_path / "e.jsonl"))
    (tmp_path / "d.tsv").write_text("x")
    with pytest.raises(DataError, match="set data.format"):
        read_records(str(tmp_path / "d.tsv"))
    (tmp_path / "bad.jsonl").write_text("{not json")
    with pytest.raises(DataError, match="bad.jsonl: line 1 is not JSON"):
        read_records(str(tmp_path / "bad.jsonl"))


def _cfg(path, **model):
    return validate({"model": {"name_or_path": "builtin:tiny-bert", **model},
                     "data": {"train_file": str(path), "eval_ratio": 0.25, "max_length": 64},
                     "output": {"output_dir": str(Path(path).parent / "runs")}})


def test_classification_split_and_missing_column(tmp_path, tokenizer):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in ROWS))
    data = prepare_data(_cfg(p), tokenizer)
    assert len(data.train) == 15 and len(data.eval) == 5
    assert data.train[0]["input_ids"][0] == tokenizer.cls_token_id and data.train[0]["labels"] in (0, 1)
    again = prepare_data(_cfg(p), tokenizer)
    assert again.eval.to_list() == data.eval.to_list()  # the held-out split is seeded
    cfg = validate({**_cfg(p).model_dump(), "data": {"train_file": str(p), "label_column": "sentiment"}})
    assert cfg.output.output_dir.endswith("runs")
    with pytest.raises(DataError,
                       match=r"column 'sentiment' is missing \(columns: label, text\); set data.label_column"):
        prepare_data(cfg, tokenizer)


def test_label_out_of_range_and_num_labels_from_the_data(tmp_path, tokenizer):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps({"text": "x", "label": 5 if i == 0 else i % 2}) for i in range(4)))
    with pytest.raises(DataError, match=r"label 5 \(record 1\) is outside \[0, 2\); set model.num_labels"):
        prepare_data(_cfg(p, num_labels=2), tokenizer)
    cfg = _cfg(p)
    assert cfg.model.num_labels is None
    assert prepare_data(cfg, tokenizer).resolve(cfg).model.num_labels == 6  # the largest class number + 1


def _alpaca_before(row, tokenizer, max_length):
    """How scaletrain tokenized an alpaca row before the datasets data layer (per row, prompt and answer apart)."""
    extra = str(row.get("input") or "").strip()
    prompt = (f"### Instruction:\n{row['instruction']}\n\n### Input:\n{extra}\n\n### Response:\n" if extra
              else f"### Instruction:\n{row['instruction']}\n\n### Response:\n")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(str(row["output"]), add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
    return ((prompt_ids + answer_ids)[:max_length], ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_length])


def test_alpaca_tokens_and_labels_are_unchanged_from_before(tmp_path, tokenizer):
    from scaletrain.data.demo import alpaca_rows

    rows = alpaca_rows(60, seed=1) + [{"instruction": "Opposite of hot?", "input": "", "output": "cold"}]
    p = tmp_path / "a.json"
    p.write_text(json.dumps(rows))
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(p), "eval_ratio": 0.0, "max_length": 64, "template": "alpaca"},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    got = prepare_data(cfg, tokenizer).train.to_list()
    order = list(range(len(rows)))
    __import__("random").Random(cfg.train.seed).shuffle(order)  # the seeded shuffle of the split, as before
    assert len(got) == len(rows)
    for row, ex in zip([rows[i] for i in order], got):
        ids, labels = _alpaca_before(row, tokenizer, 64)
        assert len(ids) < 64  # all fit: the cut rule is the only change (prompt first, tested in test_chat_data)
        assert ex["input_ids"] == ids and ex["labels"] == labels


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
    from scaletrain.data.demo import NEGATIVE, POSITIVE, write_demo_data

    out = write_demo_data(tmp_path, n_sentiment=10, n_alpaca=10, n_reviews=50)
    rows = [json.loads(line) for line in (out / "reviews.jsonl").read_text().splitlines()]
    assert len(rows) == 50
    for r in rows:  # six sentences, every sentiment word of the review's own label
        assert r["text"].count(".") >= 6
        words = {w.strip(".,;:") for w in r["text"].split()}
        mine, other = (POSITIVE, NEGATIVE) if r["label"] else (NEGATIVE, POSITIVE)
        assert words & set(mine) and not words & set(other)
    monkeypatch.setenv("DEMO_DATA", str(out))
    cfg = load_config(Path(__file__).parents[2] / "examples" / "scale_lora.yaml", [])
    assert cfg.model.finetuning_type == "lora" and cfg.data.max_length == 64
    data = prepare_data(cfg, tokenizer)
    lengths = [len(ex["input_ids"]) for ex in data.train]
    assert max(lengths) == 64 and sum(lengths) / len(lengths) > 56  # mostly full 64-token sequences


def test_balanced_ranks_hold_similar_tokens_and_train_the_same_steps_on_any_world_size():
    import random

    rng = random.Random(0)
    lengths = [rng.choice([8, 16, 200, 500]) for _ in range(640)]
    b, accum = 4, 2

    def steps(world):  # the samples of each optimizer step, and each rank's tokens in it
        ranks = [ResumableSampler(640, world, r, 7, lengths, b, accum * 2 // world) for r in range(world)]
        orders = [list(s) for s in ranks]
        per = b * accum * 2 // world
        return [(sorted(i for o in orders for i in o[k * per:(k + 1) * per]),
                 [sum(lengths[i] for i in o[k * per:(k + 1) * per]) for o in orders])
                for k in range(len(orders[0]) // per)]

    one, two = steps(1), steps(2)
    assert [s for s, _ in one] == [s for s, _ in two]  # the same examples form each step on 1 and 2 ranks
    spread = [max(t) / min(t) for _, t in two]
    plain = [ResumableSampler(640, 2, r, 7) for r in range(2)]
    orders = [list(s) for s in plain]
    plain_spread = [max(sum(lengths[i] for i in o[k * 8:(k + 1) * 8]) for o in orders)
                    / min(sum(lengths[i] for i in o[k * 8:(k + 1) * 8]) for o in orders) for k in range(40)]
    assert sorted(spread)[len(spread) // 2] < 1.1 < sorted(plain_spread)[len(plain_spread) // 2]
    s = ResumableSampler(640, 2, 1, 7, lengths, b, accum)
    full = list(s)
    s.set_position(0, 24)
    assert list(s) == full[24:] and len(s) == len(full) - 24  # resumable mid-epoch


@pytest.mark.parametrize("bad,reason", [
    ({"text": None, "label": 1}, "empty or missing 'text'"),
    ({"text": "fine", "label": None}, "missing label"),
    ({"text": "fine", "label": 0.7}, "label 0.7 is not a whole class number"),
    ({"text": "fine", "label": "positive"}, "label 'positive' is not a number"),
])
def test_bad_classification_records_are_skipped_and_counted_never_changed(tmp_path, tokenizer, bad, reason):
    rows = [dict(r) for r in ROWS] * 10 + [bad]
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    data = prepare_data(_cfg(p), tokenizer)
    assert len(data.train) + len(data.eval) == 200 and "None" not in json.dumps(data.train.to_list())
    assert any(reason in n and "(line 201)" in n for n in data.notes), data.notes
    assert all(isinstance(ex["labels"], int) and ex["labels"] in (0, 1) for ex in data.train)


def test_lengths_are_read_from_arrow_without_token_lists():
    """The driver's length pass reads list lengths from Arrow batch by batch (data/prepare.py); the values equal
    Python's len() of each row, also through a selection (an indices mapping) and for preference pairs."""
    import datasets

    from scaletrain.data import lengths as prepare

    rows = [list(range(n)) for n in (3, 0, 7, 1, 12, 5)]
    ds = datasets.Dataset.from_dict({"input_ids": rows, "labels": rows})
    picked = ds.select([4, 0, 2])
    assert prepare.example_lengths(picked).tolist() == [12, 3, 7]
    old = prepare.LENGTH_BATCH
    try:
        prepare.LENGTH_BATCH = 2  # several Arrow batches
        assert prepare.example_lengths(ds).tolist() == [len(r) for r in rows]
    finally:
        prepare.LENGTH_BATCH = old
    pairs = datasets.Dataset.from_dict({"chosen_input_ids": rows[:2], "chosen_labels": rows[:2],
                                        "rejected_input_ids": rows[2:4], "rejected_labels": rows[2:4]})
    assert prepare.example_lengths(pairs).tolist() == [3 + 7, 0 + 1]


def test_tokenization_processes_default_to_every_core_for_a_large_source_only(monkeypatch):
    import os

    from scaletrain.data.spread import PARALLEL_ROWS, tokenize_processes

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert tokenize_processes(None, PARALLEL_ROWS) == 8
    assert tokenize_processes(None, PARALLEL_ROWS - 1) is None  # a process costs more than it saves
    assert tokenize_processes(3, 1000) == 3 and tokenize_processes(3, 999) is None
    assert tokenize_processes(1, 10 ** 6) is None  # told: one process


def test_tokenization_on_the_cluster_needs_one_and_auto_needs_several_nodes(monkeypatch):
    import datasets

    from scaletrain.data import on_ray
    from scaletrain.errors import ConfigError

    monkeypatch.setattr(on_ray, "cluster_nodes", lambda: 0)
    with pytest.raises(ConfigError, match=r"data.tokenize_on=cluster: this driver is not connected to a Ray cluster; "
                                          r"run with scaling.launcher=ray"):
        on_ray.on_cluster("cluster", 10, 20_000)
    assert not on_ray.on_cluster("auto", 10 ** 6, 20_000) and not on_ray.on_cluster("driver", 10 ** 6, 20_000)
    monkeypatch.setattr(on_ray, "cluster_nodes", lambda: 1)
    assert on_ray.on_cluster("cluster", 10, 20_000) and not on_ray.on_cluster("auto", 10 ** 6, 20_000)
    monkeypatch.setattr(on_ray, "cluster_nodes", lambda: 2)
    assert on_ray.on_cluster("auto", 20_000, 20_000) and not on_ray.on_cluster("auto", 19_999, 20_000)
    assert not on_ray.on_cluster("driver", 10 ** 6, 20_000)
    # a shard whose records all trained has a null-typed skip column: it takes the others' type
    a = datasets.Dataset.from_dict({"_skip": [None, "too long"], "n": [1, 2]})
    b = datasets.Dataset.from_dict({"_skip": [None, None], "n": [3, 4]})
    assert on_ray._common([b, a])["_skip"].dtype == "string"


def test_grpo_groups_repeat_whole_steps_for_several_iterations():
    """rl.num_iterations = mu: each step's window (per_device_batch x accumulation rows, whole groups) comes mu
    times in a row, on every rank, and an epoch is mu times as long; a resumed position lands in the same order."""
    for rank in (0, 1):
        once = ResumableSampler(64, 2, rank, 0, batch_size=4, accumulation=2, group=4)
        twice = ResumableSampler(64, 2, rank, 0, batch_size=4, accumulation=2, group=4, repeat=2)
        a, b = once.epoch_order(), twice.epoch_order()
        windows = [a[i:i + 8] for i in range(0, len(a), 8)]
        assert b == [i for w in windows for _ in range(2) for i in w] and len(twice) == 2 * len(once)
        twice.set_position(0, 12)
        assert list(twice) == b[12:]

"""The record stream of data.streaming (data/stream.py): every record once per epoch in a seeded shuffled order,
a position that restores the exact continuation without reading the consumed shards again, the same tokens as a
prepared run, and the refusals of what a stream cannot do."""

import json
from pathlib import Path

import pytest

from scaletrain.config.schema import Config
from scaletrain.data import stream as st
from scaletrain.errors import DataError


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"instruction": f"Say {i}.", "input": "", "output": f"{i} " * (i % 5 + 1)} for i in range(start, start + n)]


def _jsonl(folder: Path, sizes=(7, 5, 9)) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    out, start = [], 0
    for s, n in enumerate(sizes):
        recs = _records(n, start)
        lines = [json.dumps(r) for r in recs]
        lines.insert(2, "")  # a blank line: not a record, and the lines after it keep their numbers
        (folder / f"part-{s:02d}.jsonl").write_text("\n".join(lines) + "\n")
        out += recs
        start += n
    return out


def _stream(tmp_path, buffer=4, position=None, sizes=(7, 5, 9)):
    src = st.list_shards(str(tmp_path / "shards"), "auto", "data.train_file")
    return src, st.ShardStream(src, seed=3, buffer_size=buffer, position=position)


def _text(src, rid, raw) -> str:
    return st.parse(src, rid, raw)["instruction"]


def test_every_record_once_per_epoch_in_a_seeded_order_that_changes_by_epoch(tmp_path):
    recs = _jsonl(tmp_path / "shards")
    src, stream = _stream(tmp_path)
    first = [_text(src, *next(stream)) for _ in range(len(recs))]
    second = [_text(src, *next(stream)) for _ in range(len(recs))]
    assert sorted(first) == sorted(second) == sorted(r["instruction"] for r in recs)
    assert first != [r["instruction"] for r in recs] and first != second
    assert stream.pos.epoch == 1
    again = [_text(src, *x) for x in (next(st.ShardStream(src, 3, 4)) for _ in range(1))]
    assert again == first[:1]  # the same seed, the same stream


@pytest.mark.parametrize("cut", [0, 1, 4, 9, 20, 21, 26])
def test_a_restored_position_continues_exactly_and_skips_the_consumed_shards(tmp_path, monkeypatch, cut):
    _jsonl(tmp_path / "shards")
    src, stream = _stream(tmp_path)
    for _ in range(cut):
        next(stream)
    state = json.loads(json.dumps(stream.state()))  # what a checkpoint keeps
    expected = [next(stream)[0] for _ in range(30)]
    opened = []
    real = st.read_shard
    monkeypatch.setattr(st, "read_shard", lambda s, shard, start=0: (opened.append((shard, start)),
                                                                       real(s, shard, start))[1])
    _, resumed = _stream(tmp_path, position=state)
    waiting = {rid >> st.ROW_BITS for rid in state["buffer"]}
    assert {shard for shard, _ in opened} == waiting  # only the shards whose records wait in the buffer
    opened.clear()
    got = [next(resumed)[0] for _ in range(30)]
    assert got == expected
    if state["shard"] < len(src.shards):  # then the shard it stopped in, at the row it stopped at
        assert opened[0] == (resumed.order(state["epoch"])[state["shard"]], state["row"])


def test_a_resume_needs_the_same_shards(tmp_path):
    _jsonl(tmp_path / "shards")
    _, stream = _stream(tmp_path)
    next(stream)
    state = stream.state()
    (tmp_path / "shards" / "part-09.jsonl").write_text(json.dumps(_records(1)[0]) + "\n")
    with pytest.raises(DataError, match="the shards differ from the ones the checkpoint"):
        _stream(tmp_path, position=state)
    (tmp_path / "shards" / "part-09.jsonl").unlink()
    _stream(tmp_path, position=state)  # the same files again
    with (tmp_path / "shards" / "part-01.jsonl").open("a") as f:  # a shard written to since
        f.write(json.dumps(_records(1)[0]) + "\n")
    with pytest.raises(DataError, match="or one changed size"):
        _stream(tmp_path, position=state)


def test_parquet_shards_stream_the_same_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = _jsonl(tmp_path / "jl")
    (tmp_path / "pq").mkdir()
    start = 0
    for s, n in enumerate((7, 5, 9)):
        pq.write_table(pa.Table.from_pylist(recs[start:start + n]), tmp_path / "pq" / f"part-{s:02d}.parquet",
                       row_group_size=3)
        start += n
    src = st.list_shards(str(tmp_path / "pq"), "auto", "data.train_file")
    assert src.fmt == "parquet"
    stream = st.ShardStream(src, 3, 4)
    got = [st.parse(src, *next(stream))["instruction"] for _ in range(len(recs))]
    assert sorted(got) == sorted(r["instruction"] for r in recs)
    for _ in range(5):
        next(stream)
    resumed = st.ShardStream(src, 3, 4, stream.state())  # a restore mid-row-group
    assert [next(resumed)[0] for _ in range(10)] == [next(stream)[0] for _ in range(10)]


def test_shards_that_cannot_stream_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"data.train_file=.*empty: no JSON Lines or Parquet shard found there"):
        st.list_shards(str(tmp_path / "empty"), "auto", "data.train_file")
    _jsonl(tmp_path / "mixed")
    (tmp_path / "mixed" / "x.parquet").write_bytes(b"")
    with pytest.raises(DataError, match="the shards mix formats"):
        st.list_shards(str(tmp_path / "mixed"), "auto", "data.train_file")
    src = st.list_shards(str(tmp_path / "mixed" / "part-0*.jsonl"), "auto", "data.train_file")  # a glob
    assert len(src.shards) == 3
    assert "not a JSON line" in st.parse(src, 5, b"{oops\n") and "part-00.jsonl line 6" in st.parse(src, 5, b"{")


def test_the_stream_trains_the_tokens_a_prepared_run_trains(tmp_path):
    from scaletrain.data import prepare_data
    from scaletrain.model.tokenizer import load_tokenizer

    recs = _jsonl(tmp_path / "shards", sizes=(12,))
    base = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
            "data": {"train_file": str(tmp_path / "shards" / "part-00.jsonl"), "template": "alpaca",
                     "max_length": 16, "eval_ratio": 0.0, "cache_dir": str(tmp_path / "cache")},
            "output": {"output_dir": str(tmp_path / "runs")}}
    tokenizer = load_tokenizer("builtin:tiny-llama")
    prepared = prepare_data(Config.model_validate(base), tokenizer).train
    streamed_cfg = Config.model_validate({**base, "data": {**base["data"], "streaming": True},
                                          "train": {"max_steps": 3}})
    pre = st.prepare_stream(streamed_cfg, tokenizer)
    assert pre.stream.fmt == "jsonl" and len(pre.eval) == 0
    rows, reasons = st.StreamEncoder(pre.stream, streamed_cfg, tokenizer, recs[:2])(recs)
    assert not any(reasons)
    pairs = lambda ids, labels: sorted(zip(map(tuple, ids), map(tuple, labels)))
    assert pairs([r["input_ids"] for r in rows], [r["labels"] for r in rows]) == pairs(prepared["input_ids"],
                                                                                       prepared["labels"])
    assert len(rows) == 12 and any(-100 in r["labels"] for r in rows)
    text_cfg = Config.model_validate({**base, "data": {**base["data"], "streaming": True, "formatting": "text"},
                                      "train": {"max_steps": 3}})
    text = st.StreamEncoder(pre.stream, text_cfg, tokenizer, [{"text": "a b"}], st.streamed_source(text_cfg))
    rows, reasons = text([{"other": 1}, {"text": "c d"}])  # no "text" in the first: a skip, not a KeyError
    assert len(rows) == 1 and reasons[0] and not reasons[1]
    assert text([{"other": 1}])[0] == []


@pytest.mark.parametrize("data,train,message", [
    ({}, {}, "data.streaming=true needs train.max_steps"),
    ({"packing": True}, {"max_steps": 5}, "data.streaming=true with data.packing=True: packing plans"),
    ({"balance_ranks": True}, {"max_steps": 5}, "with data.balance_ranks=True: length balancing"),
    ({"eval_ratio": 0.1}, {"max_steps": 5}, "with data.eval_ratio=0.1: a hold-out needs the whole set; give "
                                            "data.eval_file"),
    ({"multi_turn": "per_turn"}, {"max_steps": 5}, "with data.multi_turn=per_turn"),
    ({"max_samples": 100}, {"max_steps": 5}, "with data.max_samples=100: a cap of the file counts its records"),
    ({}, {"max_steps": 5, "stage": "dpo"}, "data.streaming=true trains a causal LM's supervised fine-tuning"),
])
def test_what_a_stream_cannot_do_is_one_line_at_load(data, train, message):
    cfg = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
           "data": {"train_file": "x.jsonl", "streaming": True, **data}, "train": train}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Config.model_validate(cfg)


def test_a_stream_turns_off_what_it_cannot_do_when_not_asked_for():
    cfg = Config.model_validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                                 "data": {"train_file": "x.jsonl", "streaming": True}, "train": {"max_steps": 5}})
    assert (cfg.data.balance_ranks, cfg.data.eval_ratio) == (False, 0.0)
    again = Config.model_validate(cfg.model_dump(mode="json"))  # the worker's copy validates too
    assert again.data == cfg.data


def test_bad_lines_in_a_stream_are_skips_until_they_pass_max_bad_ratio_then_one_line_naming_the_first(tmp_path):
    from types import SimpleNamespace

    from scaletrain.model.tokenizer import load_tokenizer
    from scaletrain.worker import streamed

    folder = tmp_path / "shards"
    folder.mkdir()
    good = [json.dumps(r) for r in _records(300)]
    good[7] = "{not json"
    (folder / "a.jsonl").write_text("\n".join(good) + "\n")
    cfg = Config.model_validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                                 "data": {"train_file": str(folder), "template": "alpaca", "streaming": True,
                                          "max_bad_ratio": 0.01}, "train": {"max_steps": 5}})
    src = st.list_shards(str(folder), "auto", "data.train_file")
    data = object.__new__(streamed.StreamData)
    data.t = SimpleNamespace(cfg=cfg, ctx=SimpleNamespace(world_rank=1), spec=SimpleNamespace(pad_token_id=0))
    data.src, data.seen, data.skipped, data.first_bad = src, 0, {}, None
    data.encode = st.StreamEncoder(src, cfg, load_tokenizer("builtin:tiny-llama"), _records(2))
    stream = st.ShardStream(src, 0, 1)  # in file order
    rows = data._examples([next(stream) for _ in range(250)])
    assert len(rows) == 249 and data.first_bad.startswith(f"{src.shards[0]} line 8: not a JSON line")
    bad = [(rid, b"[1]") for rid, _ in (next(stream) for _ in range(3))]  # 4 of 253: over 1%
    with pytest.raises(DataError, match=r"data.train_file=.*: 4 of the 253 records rank 1 read cannot be trained on "
                                        r"\(more than data.max_bad_ratio=0.01\); the first is .*a.jsonl line 8"):
        data._examples(bad)

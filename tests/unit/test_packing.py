"""Packing: the same examples packed or padded give the same summed loss and the same gradients."""

import copy
import json

import pytest
import torch

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, Collator, model_inputs, prepare_data
from scaletrain.data.packing import pack
from scaletrain.errors import ConfigError
from scaletrain.model.build import build_model, packing_support_error
from scaletrain.model.tokenizer import Vocab, load_tokenizer
from scaletrain.worker.step import token_loss_sum


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:tiny-llama")


def _data(tmp_path, tok, **data):
    rows = [{"instruction": f"Say {'word ' * (i % 9)}now", "output": "ok " * (1 + (i * 7) % 23)} for i in range(60)]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
                    "data": {"train_file": str(path), "eval_ratio": 0.0, "max_length": 128, **data},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    return cfg, prepare_data(cfg, tok)


def test_packed_rows_are_full_and_keep_every_example_whole(tmp_path, tok):
    _, plain = _data(tmp_path, tok)
    _, packed = _data(tmp_path, tok, packing=True)
    assert sum(packed.train["examples"]) == len(plain.train) and len(packed.train) < len(plain.train) / 2
    assert all(len(r) <= 128 for r in packed.train["input_ids"])
    tokens = sum(len(r) for r in packed.train["input_ids"])
    assert tokens == sum(len(r) for r in plain.train["input_ids"])
    assert tokens / (128 * len(packed.train)) > 0.9  # first-fit decreasing fills the rows
    row = packed.train[0]
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0]
    assert len(starts) == row["examples"] and all(row["labels"][s] == IGNORE_INDEX for s in starts)
    again = _data(tmp_path, tok, packing=True, overwrite_cache=True)[1]
    assert again.train.to_list() == packed.train.to_list()  # seeded: the same rows on every run


@pytest.mark.parametrize("attention", ["by-example", "block-mask"])
def test_packed_and_padded_batches_give_the_same_loss_and_gradients(tmp_path, tok, attention):
    """by-example: SDPA on each example's span (what a packed run uses); block-mask: transformers' SDPA over the
    whole row with its block-diagonal mask (eager models, sliding windows)."""
    from unittest import mock

    from scaletrain.model import attention as by_example

    cfg, plain = _data(tmp_path, tok)
    examples = [plain.train[i] for i in range(6)]
    torch.manual_seed(0)
    model = build_model(cfg.model, Vocab.of(tok))
    twin = copy.deepcopy(model)
    if attention == "by-example":
        assert by_example.isolate_examples(twin) == by_example.NAME
    padded = Collator(tok.pad_token_id)(examples)
    ds = pack(__import__("datasets").Dataset.from_list(examples), 400, seed=1)
    packed = Collator(tok.pad_token_id)([ds[i] for i in range(len(ds))])
    assert "attention_mask" not in packed and packed["input_ids"].shape[0] < 6
    a = token_loss_sum(model(**model_inputs(padded, labels=False), use_cache=False).logits, padded["labels"])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(by_example.F, "scaled_dot_product_attention", side_effect=sdpa) as calls:
        b = token_loss_sum(twin(**model_inputs(packed, labels=False), use_cache=False).logits, packed["labels"])
    if attention == "by-example":  # one causal call per example (and per padding tail) in every layer
        spans = sum(int((row == 0).sum()) for row in packed["position_ids"])
        assert calls.call_count == spans * twin.config.num_hidden_layers and spans >= 6
    assert int((padded["labels"][:, 1:] != IGNORE_INDEX).sum()) == int((packed["labels"][:, 1:] != IGNORE_INDEX).sum())
    assert b.item() == pytest.approx(a.item(), rel=1e-5)
    a.backward()
    b.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


def test_by_example_attention_leaves_plain_batches_and_saved_configs_as_they_were(tmp_path, tok):
    from scaletrain.model.attention import NAME

    cfg, plain = _data(tmp_path, tok)
    torch.manual_seed(0)
    model = build_model(cfg.model, Vocab.of(tok))
    twin = build_model(cfg.model, Vocab.of(tok), packed=True)
    twin.load_state_dict(model.state_dict())
    assert twin.config._attn_implementation == NAME and model.config._attn_implementation == "sdpa"
    batch = Collator(tok.pad_token_id)([plain.train[i] for i in range(4)])  # padded, with an attention mask
    with torch.no_grad():
        assert torch.equal(model(**model_inputs(batch, labels=False)).logits,
                           twin(**model_inputs(batch, labels=False)).logits)
    twin.save_pretrained(tmp_path / "final")
    assert NAME not in (tmp_path / "final" / "config.json").read_text()  # loads anywhere, without scaletrain


def test_packing_needs_a_causal_lm_and_a_model_that_isolates_examples():
    with pytest.raises(ConfigError, match="data.packing applies to model.task=causal-lm"):
        from scaletrain.config.load import validate as v

        v({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x", "packing": True}})
    llama = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                      "data": {"train_file": "x", "packing": True}})
    assert packing_support_error(llama.model, Vocab(100, 0)) is None


def _rss_file_kb() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssFile"))


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="reads /proc (Linux)")
def test_release_drops_the_pages_a_pass_read_and_keeps_the_data(tmp_path):
    # The packer reads examples from all over a memory-mapped cache; without the release every page read stays
    # resident until the pass ends (issue #46: +1.9 GB at 2M rows).
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    from scaletrain.data.packing import mapped_spans, release

    ids = pa.ListArray.from_arrays(pa.array(range(0, 8_000_001, 1000), pa.int32()),
                                   pa.array(range(8_000_000), pa.int32()))  # 32 MB of ids
    datasets.Dataset(pa.table({"input_ids": ids})).save_to_disk(str(tmp_path / "c"))
    ds = datasets.load_from_disk(str(tmp_path / "c"))
    column = ds.with_format("arrow")[:]["input_ids"].combine_chunks().flatten()
    total = pc.sum(column).as_py()
    read = _rss_file_kb()
    released = release(mapped_spans(f["filename"] for f in ds.cache_files))
    assert released >= 32_000_000
    assert read - _rss_file_kb() > 25_000  # KB: the 32 MB read are no longer resident
    assert pc.sum(column).as_py() == total == 8_000_000 * 7_999_999 // 2  # the mapping still reads the same ids
    assert mapped_spans([str(tmp_path / "not-mapped.arrow")]) == [] and release([]) == 0


def test_packing_that_releases_pages_between_takes_writes_the_same_rows(tmp_path, monkeypatch):
    # A split larger than MAPPED_BUDGET has its pages released while it is packed: the rows must not change.
    import datasets
    import pyarrow as pa

    from scaletrain.data import packing

    lengths = [3 + (i * 37) % 90 for i in range(500)]
    ids = pa.array([[i * 1000 + j for j in range(n)] for i, n in enumerate(lengths)], pa.list_(pa.int32()))
    datasets.Dataset(pa.table({"input_ids": ids, "labels": ids.cast(pa.list_(pa.int64()))})).save_to_disk(
        str(tmp_path / "c"))
    split = datasets.load_from_disk(str(tmp_path / "c"))
    kept = packing.pack(split, 256, 3, tmp_path).to_dict()
    released, real = [], packing.release
    monkeypatch.setattr(packing, "TAKE", 7)
    monkeypatch.setattr(packing, "MAPPED_BUDGET", -(1 << 62))  # release after every take
    monkeypatch.setattr(packing, "release", lambda spans: released.append(spans) or real(spans))
    assert packing.pack(split, 256, 3, tmp_path).to_dict() == kept
    assert len(released) == -(-500 // 7) and released[0]  # each take released the split's mapped ranges

"""#73: the data step's cache holds each image's reference and token count, never its pixels; the collator (in the
data-loading workers of the rank that trains) reads, bounds and processes the images, bit for bit what the data
step used to cache; an image that breaks after the data step is skipped with its record, counted and named."""

import json

import numpy as np
import pytest
import torch

from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.data.images import load_images
from scaletrain.model.processor import image_text_factory
from scaletrain.model.tokenizer import load_tokenizer
from tests.unit.test_vision_data import _prepare
from tests.vlm import MLLM_INFO, collator, image, mllm_demo, save_tiny

# Qwen2.5-VL's and Qwen3-VL's processors are Qwen2-VL's at other sizes: make test runs them, make test-fast the two
# families of distinct rules
KINDS = ("qwen2_vl", pytest.param("qwen2_5_vl", marks=pytest.mark.slow),
         pytest.param("qwen3_vl", marks=pytest.mark.slow), "gemma3")
BOUNDS = {"image_max_pixels": 90 * 70, "image_min_pixels": 24 * 24}  # the demo's images are bounded both ways


def _sizes(demo, sizes):
    """mllm_demo's images replaced by images of ``sizes`` (cycled): some above the max bound, some below the min."""
    rows = json.loads((demo / "mllm_demo.json").read_text())
    k = 0
    for row in rows:
        for name in row["images"]:
            image(*sizes[k % len(sizes)], seed=k).save(demo / name)
            k += 1
    return rows


@pytest.mark.parametrize("kind", KINDS)
def test_the_loaders_pixels_are_the_old_cached_paths_bit_for_bit_and_the_cache_has_none(kind, tmp_path):
    """For Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3: each record's pixels from the collator equal what the data
    step cached before #73 (the record's images decoded, bounded and run through the image processor together),
    its grids and token counts equal the ones the data step sized from the headers, and no column holds pixels."""
    path = save_tiny(kind, tmp_path / kind)
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=9)
    _sizes(demo, [(150, 40), (17, 20), (64, 48), (200, 200), (33, 90)])
    data = _prepare(path, tok, demo, tmp_path, **BOUNDS)
    assert set(data.train.column_names) >= {"image_refs", "image_tokens"}
    assert not {"pixel_values", "pixel_shape"} & set(data.train.column_names)
    text = image_text_factory(str(path), tok)()
    collate = collator(path, tok, max_pixels=BOUNDS["image_max_pixels"], min_pixels=BOUNDS["image_min_pixels"])
    checked = 0
    for ex in data.train:
        if not ex["image_refs"]:
            continue
        before = text.preprocess(load_images(ex["image_refs"], "", BOUNDS["image_max_pixels"],
                                             BOUNDS["image_min_pixels"]))  # the data step's processing until #73
        batch = collate([ex])
        assert torch.equal(batch["pixel_values"], torch.from_numpy(np.asarray(before["pixel_values"])))
        assert before["tokens"] == ex["image_tokens"] and int(batch["images_skipped"]) == 0
        if kind != "gemma3":
            assert torch.equal(batch["image_grid_thw"], torch.as_tensor(before["image_grid_thw"]))
            assert ex["image_grid_thw"] == list(np.asarray(before["image_grid_thw"]).reshape(-1))
        checked += 1
    assert checked == 7  # n=9: rows 3 and 7 have no image


@pytest.mark.slow  # six photo-sized JPEGs written: make test, not make test-fast
def test_a_photo_costs_the_cache_its_reference_and_counts_not_its_pixels(tmp_path):
    """1024x768 JPEGs (the issue's photo): the cache's image columns are at most 1 KB an image (the processed
    float32 patches were ~11 MB), and the image-token mask is one byte a token at most."""
    import pyarrow as pa

    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = tmp_path / "data"
    (demo / "photos").mkdir(parents=True)
    rows = []
    for k in range(6):
        name = f"photos/{k:05d}.jpg"
        image(128, 96, seed=k).resize((1024, 768)).save(demo / name, quality=90)
        rows.append({"messages": [{"role": "user", "content": "<image>What is it?"},
                                  {"role": "assistant", "content": "A photo."}], "images": [name]})
    (demo / "mllm_demo.json").write_text(json.dumps(rows))
    (demo / "dataset_info.json").write_text(json.dumps(MLLM_INFO))
    data = _prepare(path, tok, demo, tmp_path, max_length=2048)
    table = data.train.with_format("arrow")[:]
    image_bytes = sum(table.column(c).nbytes for c in ("image_refs", "image_tokens", "image_grid_thw"))
    assert image_bytes / 6 <= 1024
    assert all(not pa.types.is_binary(f.type) and not pa.types.is_large_binary(f.type) for f in table.schema)
    assert all(ex["image_tokens"] == [ex["image_grid_thw"][1] * ex["image_grid_thw"][2] // 4] for ex in data.train)


def test_an_image_broken_after_the_data_step_skips_its_record_counted_and_named(tmp_path, capfd):
    """An image truncated (or gone) after the data step: its record's tokens leave the batch (padding, no target),
    the batch counts it, stderr names the image; the other records keep their images; a batch left with no image
    runs the tower on the stand-in; packed rows blank the one member."""
    import datasets
    from transformers import AutoConfig

    from scaletrain.data.packing import pack
    from scaletrain.model.vision import stand_in_image

    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=6)
    data = _prepare(path, tok, demo, tmp_path)
    rows = [data.train[i] for i in range(len(data.train))]
    with_images = [r for r in rows if r["image_refs"]]
    broken = with_images[0]["image_refs"][0]
    good = collator(path, tok)(with_images)
    with open(broken, "r+b") as f:
        f.truncate(200)
    collate = collator(path, tok, stand_in_image(AutoConfig.from_pretrained(str(path))))
    batch = collate(with_images)
    assert int(batch["images_skipped"]) == 1 and broken in capfd.readouterr().err
    assert (batch["labels"][0] == IGNORE_INDEX).all() and int(batch["mm_token_type_ids"][0].sum()) == 0
    assert (batch["input_ids"][0] == (tok.pad_token_id or 0)).all()
    first = int(good["image_grid_thw"][:len(with_images[0]["image_refs"])].prod(-1).sum())
    assert torch.equal(batch["pixel_values"], good["pixel_values"][first:])  # the others' images, in order
    assert torch.equal(batch["labels"][1:], good["labels"][1:])

    alone = collate([with_images[0]])  # its only image gone: the stand-in keeps the tower running
    assert int(alone["images_skipped"]) == 1 and "pixel_values" in alone
    assert (alone["labels"] == IGNORE_INDEX).all()

    packed_rows = pack(datasets.Dataset.from_list(rows), 256, seed=1, workdir=tmp_path)
    packed = [packed_rows[i] for i in range(len(packed_rows))]
    holder = next(r for r in packed if broken in r["image_refs"])
    out = collate([holder])
    assert int(out["images_skipped"]) == 1
    kept = int((out["labels"] != IGNORE_INDEX).sum())
    assert 0 < kept < int((torch.tensor(holder["labels"]) != IGNORE_INDEX).sum())  # one member blanked, not the row


def _as_parquet(demo, rows, out):
    """The rows with their images' bytes inside a Parquet file (datasets' Image feature, as the hub keeps them)."""
    import datasets

    features = datasets.Features({"messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
                                  "images": datasets.Sequence(datasets.Image())})
    table = datasets.Dataset.from_dict(
        {"messages": [r["messages"] for r in rows],
         "images": [[{"bytes": (demo / n).read_bytes(), "path": None} for n in r["images"]] for r in rows]},
        features=features)
    table.to_parquet(str(out), batch_size=3)  # row groups of 3: images read from more than one group
    return out


def _as_webdataset(demo, rows, out):
    """The rows as WebDataset shards of 4 samples: KEY.json the record, KEY.K.jpg its images."""
    import io
    import tarfile

    out.mkdir(parents=True)
    for shard in range(0, len(rows), 4):
        with tarfile.open(out / f"shard-{shard // 4:05d}.tar", "w") as tar:
            for k in range(shard, min(shard + 4, len(rows))):
                members = [(f"{k:06d}.json", json.dumps({"messages": rows[k]["messages"]}).encode())]
                members += [(f"{k:06d}.{j}.jpg", (demo / n).read_bytes()) for j, n in enumerate(rows[k]["images"])]
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return out


@pytest.mark.slow  # several data steps / the plan CLI: make test, not make test-fast
def test_parquet_with_image_bytes_and_webdataset_shards_train_the_jsons_tokens_and_pixels(tmp_path):
    """The same records from JSON with image paths, from Parquet with the images' bytes inside (datasets' Image
    feature), and from WebDataset tar shards: the same tokens, the same pixels from the loaders, and the Parquet's
    and the shards' caches hold references (tens of bytes), not the images."""
    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=9)
    rows = json.loads((demo / "mllm_demo.json").read_text())
    _as_parquet(demo, rows, demo / "mllm.parquet")
    _as_webdataset(demo, rows, demo / "shards")
    info = json.loads((demo / "dataset_info.json").read_text())
    info["mllm_parquet"] = {**info["mllm_demo"], "file_name": "mllm.parquet"}
    info["mllm_shards"] = {**info["mllm_demo"], "file_name": "shards"}
    (demo / "dataset_info.json").write_text(json.dumps(info))
    collate = collator(path, tok)

    def prepared(name):
        data = _prepare(path, tok, demo, tmp_path / name, dataset=[name], packing=False)
        table = data.train.with_format("arrow")[:]
        images = sum(len(r) for r in table.column("image_refs").to_pylist())
        assert sum(table.column(c).nbytes for c in ("image_refs", "image_tokens", "image_grid_thw")) <= 1024 * images
        return sorted((data.train[i] for i in range(len(data.train))), key=lambda ex: ex["input_ids"])

    plain = prepared("mllm_demo")
    for name, scheme in (("mllm_parquet", "row://"), ("mllm_shards", "tar://")):
        other = prepared(name)
        assert [ex["input_ids"] for ex in other] == [ex["input_ids"] for ex in plain], name
        refs = [r for ex in other for r in ex["image_refs"]]
        assert len(refs) == 10 and all(r.startswith(scheme) and len(r) < 300 for r in refs), refs[:2]
        for a, b in zip(plain, other):
            if a["image_refs"]:
                assert torch.equal(collate([a])["pixel_values"], collate([b])["pixel_values"]), name


def test_a_shard_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    from scaletrain.data.sources import load
    from scaletrain.errors import DataError

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "shard-00000.tar").write_bytes(b"not a tar file at all" * 50)
    with pytest.raises(DataError) as e:
        load(str(shards), "auto", "data.train_file", str(tmp_path / "hf"))
    said = str(e.value)
    assert said.startswith(f"data.train_file={shards}: WebDataset shard {shards / 'shard-00000.tar'} cannot be "
                           f"read (not a tar file)")
    assert len(said.splitlines()) == 1


@pytest.mark.slow  # several data steps / the plan CLI: make test, not make test-fast
def test_plan_says_what_the_loaders_give_against_a_steps_images(tmp_path):
    """plan times the model's image processor on the first images of the data and says it against the images a
    step needs on a rank (per-device batch x accumulation x images a record)."""
    import re

    import yaml

    from tests.cli import run_cli

    path = save_tiny("qwen2_vl", tmp_path / "m")
    demo = mllm_demo(tmp_path / "data", n=8)  # 1, 1, 2, 0, 1, 2, 1, 0 images: 8 over 8 records
    cfg = {"model": {"name_or_path": str(path), "task": "causal-lm", "finetuning_type": "lora"},
           "data": {"dataset_dir": str(demo), "dataset": ["mllm_demo"], "max_length": 256},
           "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3},
           "output": {"output_dir": str(tmp_path / "runs")}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    out = run_cli("plan", tmp_path / "job.yaml")
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    found = re.search(r"images: the loaders make ([0-9.]+) images/s per core .* timed on 4 of the data's images "
                      r"here\); a step needs 6.0 a rank: ([0-9.]+) core-s a step; data.loader_workers=0", said)
    assert found, said
    assert float(found.group(2)) == pytest.approx(6.0 / float(found.group(1)), rel=0.05, abs=0.01)


@pytest.mark.slow  # an S3 API server and two data steps: make test, not make test-fast
def test_a_parquet_and_a_shard_on_object_storage_are_read_where_they_are(tmp_path, s3_server, monkeypatch):
    """data.train_file on S3 (a Parquet with the images' bytes, a WebDataset shard): the driver reads the records
    from its copy, the cache references the images in the objects (every node's loaders read them there), and the
    loaders' pixels equal the local JSON's."""
    import fsspec

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)  # the standard chain, as a user sets it for MinIO
    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    fs.mkdir("vision-data")
    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=5)
    rows = json.loads((demo / "mllm_demo.json").read_text())
    fs.put_file(str(_as_parquet(demo, rows, tmp_path / "mllm.parquet")), "vision-data/mllm.parquet")
    shards = _as_webdataset(demo, rows[:4], tmp_path / "shards")
    fs.put_file(str(shards / "shard-00000.tar"), "vision-data/shard-00000.tar")
    collate = collator(path, tok)
    local = _prepare(path, tok, demo, tmp_path / "local")
    by_ids = {tuple(ex["input_ids"]): ex for ex in local.train}
    for name, scheme in (("mllm.parquet", "row://"), ("shard-00000.tar", "tar://")):
        cfg = validate({"model": {"name_or_path": str(path), "task": "causal-lm"},
                        "data": {"train_file": f"s3://vision-data/{name}", "formatting": "sharegpt",
                                 "messages_column": "messages", "role_tag": "role", "content_tag": "content",
                                 "user_tag": "user", "assistant_tag": "assistant", "images_column": "images",
                                 "eval_ratio": 0, "max_length": 256},
                        "output": {"output_dir": str(tmp_path / f"out-{name}")}})
        data = prepare_data(cfg, tok, image_text_factory(str(path), tok))
        refs = [r for ex in data.train for r in ex["image_refs"]]
        assert refs and all(r.startswith(scheme) and f"::s3://vision-data/{name}" in r for r in refs), refs[:2]
        for ex in data.train:
            if ex["image_refs"]:
                twin = by_ids[tuple(ex["input_ids"])]
                assert torch.equal(collate([ex])["pixel_values"], collate([twin])["pixel_values"]), name

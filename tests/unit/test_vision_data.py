"""#62: conversations with images, as LLaMA-Factory users bring them, through the data step: the token ids equal the
model's own processor's (Qwen2-VL, Qwen3-VL, Gemma 3 built here with their real chat templates), each image has the
processor's token count, the labels are the replies, image spans are never cut (a record that would be cut inside
one is left out and counted), and every bad input is one line naming the record and the image."""

import json
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from PIL import Image

from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.data.images import bounded
from scaletrain.data.vision import fit_whole, image_runs
from scaletrain.errors import DataError
from scaletrain.model.processor import image_text_factory
from scaletrain.model.tokenizer import load_tokenizer
from tests.vlm import collator, image, mllm_demo, reference_processor, save_tiny

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory"

KINDS = ("qwen2_vl", "qwen3_vl", "gemma3")


@pytest.fixture(scope="module", params=KINDS)
def model(request, tmp_path_factory):
    kind = request.param
    path = save_tiny(kind, tmp_path_factory.mktemp(kind))
    return kind, path, load_tokenizer(str(path))


def _prepare(path, tok, data_dir, tmp_path, **data):
    cfg = validate({"model": {"name_or_path": str(path), "task": "causal-lm"},
                    "data": {"dataset_dir": str(data_dir), "dataset": ["mllm_demo"], "eval_ratio": 0,
                             "max_length": 256, **data},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    return prepare_data(cfg, tok, image_text_factory(str(path), tok))


def _reference(kind, tok, row, base):
    """The model's processor on the row: its chat template applied to image parts, then its images processed."""
    messages = []
    for m in row["messages"]:
        pieces = m["content"].split("<image>")
        parts = [{"type": "image"}] * (len(pieces) - 1) + ([{"type": "text", "text": pieces[-1]}] if pieces[-1] else [])
        messages.append({"role": m["role"], "content": parts if len(pieces) > 1 else m["content"]})
    processor = reference_processor(kind, tok)
    text = processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(base / p).convert("RGB") for p in row["images"]] or None
    return processor(text=[text], images=images, add_special_tokens=False)


def test_token_ids_and_image_tokens_equal_the_processors_and_labels_are_the_replies(model, tmp_path):
    kind, path, tok = model
    demo = mllm_demo(tmp_path / "data", n=6)
    rows = json.loads((demo / "mllm_demo.json").read_text())
    data = _prepare(path, tok, demo, tmp_path)
    collate = collator(path, tok)
    assert len(data.train) == len(rows)
    for row in rows:
        ref = _reference(kind, tok, row, demo)
        same = [ex for ex in data.train if ex["input_ids"] == list(ref["input_ids"][0])]  # token for token
        if row["images"]:  # Gemma's rows of one question and one image each have the same ids: their pixels differ
            pixels = torch.as_tensor(np.asarray(ref["pixel_values"]))  # the loaders' pixels: the processor's
            same = [ex for ex in same if torch.equal(collate([ex])["pixel_values"], pixels)]
        assert len(same) >= 1
        ex = same[0]
        image_id = tok.convert_tokens_to_ids("<image_soft_token>" if kind == "gemma3" else "<|image_pad|>")
        assert sum(ex["image_tokens"]) == list(ref["input_ids"][0]).count(image_id) == sum(
            t == image_id for t in ex["input_ids"])
        assert len(ex["image_tokens"]) == len(row["images"])
        trained = tok.decode([t for t in ex["labels"] if t != IGNORE_INDEX])
        assert trained.startswith(row["messages"][1]["content"]) and "<image" not in trained, trained


def test_the_collator_concatenates_the_rows_images_and_masks_image_tokens(model, tmp_path):
    kind, path, tok = model
    data = _prepare(path, tok, mllm_demo(tmp_path / "data", n=6), tmp_path)
    rows = [data.train[i] for i in range(len(data.train))]
    batch = collator(path, tok)(rows)
    n_images = sum(len(r["image_tokens"]) for r in rows)
    assert batch["pixel_values"].shape[0] == (n_images if kind == "gemma3" else sum(
        int(torch.tensor(r["image_grid_thw"]).view(-1, 3).prod(-1).sum()) for r in rows))
    types = batch["token_type_ids" if kind == "gemma3" else "mm_token_type_ids"]
    assert int(types.sum()) == sum(sum(r["image_tokens"]) for r in rows)
    text_only = collator(path, tok)([r for r in rows if not r["image_tokens"]])
    assert "pixel_values" not in text_only


def test_image_spans_are_never_cut():
    ids = [1, 2, 9, 7, 7, 7, 8, 3, 4, 5, 6, 10, 11, 12]  # 9 7 7 7 8: an image with its marks
    mask = [0] * 7 + [0, 0, 0, 0, 1, 1, 1]
    runs = image_runs(ids, 7, (9, 8))
    assert runs == [(2, 7)]
    for cutoff in range(8, 14):
        out, out_mask, why = fit_whole(ids, mask, cutoff, runs)
        assert not why and len(out) <= cutoff and out.count(7) == 3 and out[out.index(7) - 1] == 9
    assert "alone are 5 tokens" in fit_whole(ids, mask, 5, runs)[2]
    # two images and a reply that takes the budget: the later image would be dropped, so the record is left out
    ids2 = [1, 9, 7, 7, 8, 2, 9, 7, 7, 8, 3] + [20] * 10
    mask2 = [0] * 11 + [1] * 10
    assert "no room for its image 2" in fit_whole(ids2, mask2, 14, image_runs(ids2, 7, (9, 8)))[2]


def test_a_record_whose_images_do_not_fit_is_left_out_and_counted(model, tmp_path):
    kind, path, tok = model
    demo = mllm_demo(tmp_path / "data", n=8, text_only_every=2)  # rows 1, 3, 5, 7: text only
    data = _prepare(path, tok, demo, tmp_path, max_length=12 if kind == "gemma3" else 16, max_bad_ratio=0.9,
                    max_truncated_ratio=1.0)
    image_id = tok.convert_tokens_to_ids("<image_soft_token>" if kind == "gemma3" else "<|image_pad|>")
    for ex in data.train:  # what was kept was cut in its text only
        assert len(ex["input_ids"]) <= data_max(kind) and sum(ex["image_tokens"]) == ex["input_ids"].count(image_id)
    assert sum(data.skipped.values()) >= 1
    said = [n for n in data.notes if "image tokens are never cut" in n]
    assert said and "record" in said[0], data.notes


def data_max(kind):
    return 12 if kind == "gemma3" else 16


def test_placeholders_and_images_that_disagree_leave_the_record_out_named(model, tmp_path):
    kind, path, tok = model
    demo = mllm_demo(tmp_path / "data", n=6)
    rows = json.loads((demo / "mllm_demo.json").read_text())
    rows[2]["messages"][0]["content"] = rows[2]["messages"][0]["content"].replace("<image>", "", 1)
    (demo / "mllm_demo.json").write_text(json.dumps(rows))
    data = _prepare(path, tok, demo, tmp_path, max_bad_ratio=0.5)
    assert len(data.train) == 5
    said = [n for n in data.notes if "placeholder" in n]
    assert said and "record 3" in said[0] and "1 <image> placeholder(s) and its images column 2" in said[0], said


def _break(demo, how):
    rows = json.loads((demo / "mllm_demo.json").read_text())
    target = demo / rows[1]["images"][0]
    if how == "missing":
        target.unlink()
    elif how == "not an image":
        target.write_text("hello")
    else:  # truncated
        target.write_bytes(target.read_bytes()[:200])
    return rows[1]["images"][0]


@pytest.mark.parametrize("how,message", [("missing", "does not exist"), ("not an image", "not an image Pillow"),
                                         ("truncated", "damaged or truncated")])
def test_an_unreadable_image_stops_the_data_step_naming_the_record_and_the_image(tmp_path, how, message):
    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=4)
    name = _break(demo, how)
    with pytest.raises(DataError) as e:
        _prepare(path, tok, demo, tmp_path)
    said = str(e.value)
    assert "record 2" in said and name in said and message in said and len(said.splitlines()) == 1, said


class _DeadStore(fsspec.AbstractFileSystem):
    """A store that does not answer."""

    protocol = "deadstore"

    def _open(self, path, mode="rb", **kwargs):
        raise ConnectionError("connection refused by 10.0.0.1:9000")


def test_images_by_uri_and_a_store_that_does_not_answer(tmp_path):
    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=4)
    rows = json.loads((demo / "mllm_demo.json").read_text())
    memory = fsspec.filesystem("memory")
    for row in rows:
        for k, name in enumerate(row["images"]):
            memory.pipe(f"/imgs/{name}", (demo / name).read_bytes())
            row["images"][k] = f"memory://imgs/{name}"
    (demo / "mllm_demo.json").write_text(json.dumps(rows))
    assert len(_prepare(path, tok, demo, tmp_path).train) == 4
    fsspec.register_implementation("deadstore", _DeadStore, clobber=True)
    rows[0]["images"][0] = "deadstore://bucket/a.jpg"
    (demo / "mllm_demo.json").write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"record 1: image deadstore://bucket/a.jpg cannot be read from its store "
                                        r"\(ConnectionError: connection refused"):
        _prepare(path, tok, demo, tmp_path / "again")


def test_the_cache_key_covers_the_images_content(tmp_path):
    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=4)
    first = _prepare(path, tok, demo, tmp_path)
    assert _prepare(path, tok, demo, tmp_path).cached
    rows = json.loads((demo / "mllm_demo.json").read_text())
    image(50, 50, seed=99).save(demo / rows[0]["images"][0])  # the same name, other pixels
    again = _prepare(path, tok, demo, tmp_path)
    assert not again.cached and again.train_path != first.train_path


def test_images_on_a_text_model_and_videos_are_one_line(tmp_path):
    from tests.conftest import save_tiny_llama

    text_model = save_tiny_llama(tmp_path / "llama")
    tok = load_tokenizer(str(text_model))
    demo = mllm_demo(tmp_path / "data", n=4)
    with pytest.raises(DataError, match="'images' column, and model.name_or_path is a text model"):
        _prepare(text_model, tok, demo, tmp_path)
    vlm = save_tiny("qwen2_vl", tmp_path / "m")
    rows = json.loads((demo / "mllm_demo.json").read_text())
    (demo / "mllm_demo.json").write_text(json.dumps([{**r, "videos": []} for r in rows]))
    with pytest.raises(DataError, match="'videos' column .* videos are not supported"):
        _prepare(vlm, load_tokenizer(str(vlm)), demo, tmp_path)


def test_image_max_and_min_pixels_bound_an_image_as_llamafactory_does():
    big = bounded(image(400, 300), 100 * 100, 32 * 32)
    assert big.size == (115, 86) and big.size[0] * big.size[1] <= 100 * 100  # sqrt(1e4 / 1.2e5) = 0.2887
    small = bounded(image(10, 20).convert("L"), 768 * 768, 32 * 32)
    assert small.size == (22, 45) and small.mode == "RGB"


def test_a_batch_without_an_image_runs_the_tower_on_a_stand_in_that_changes_nothing(model, tmp_path):
    """No rank waits for another: data with images, a micro-batch of text-only rows still runs the vision tower
    (so every rank's FSDP all-gathers match), on a stand-in image whose tokens nothing sees: the loss is the same."""
    from transformers import AutoModelForImageTextToText

    from scaletrain.model.vision import stand_in_image

    kind, path, tok = model
    data = _prepare(path, tok, mllm_demo(tmp_path / "data", n=8), tmp_path)
    rows = [ex for ex in data.train if not ex["image_tokens"]]
    net = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    plain = collator(path, tok)(rows)
    stood = collator(path, tok, stand_in_image(net.config))(rows)
    assert "pixel_values" not in plain and "pixel_values" in stood
    tower = net.model.visual if kind != "gemma3" else net.model.vision_tower
    calls = []
    tower.register_forward_hook(lambda *a: calls.append(1))
    keys = ("input_ids", "labels", "attention_mask", "pixel_values", "image_grid_thw", "token_type_ids",
            "mm_token_type_ids")
    with torch.no_grad():
        without = net(**{k: v for k, v in plain.items() if k in keys}).loss
        assert not calls
        with_it = net(**{k: v for k, v in stood.items() if k in keys}).loss
    assert calls and float(with_it) == pytest.approx(float(without), abs=1e-6)


def test_preview_shows_each_image_as_one_marker_with_its_token_count(model, tmp_path):
    from scaletrain.commands.preview import examples
    from scaletrain.data.preview import describe

    kind, path, tok = model
    demo = mllm_demo(tmp_path / "data", n=3)
    cfg = validate({"model": {"name_or_path": str(path), "task": "causal-lm"},
                    "data": {"dataset_dir": str(demo), "dataset": ["mllm_demo"], "eval_ratio": 0, "max_length": 256},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    _, rows, _ = examples(cfg, 3, "train")
    two = next(ex for ex in rows if len(ex["image_tokens"]) == 2)
    text = describe(tok, two, 0)
    first, second = two["image_tokens"]
    assert f"<image 1: {first} tokens>" in text and f"<image 2: {second} tokens>" in text, text
    assert "[[Both" not in text and "<|image_pad|>" not in text and "<image_soft_token>" not in text
    assert text.count("[[") == 1  # the reply, as for text


def test_llamafactorys_qwen3vl_example_reads_its_mix_of_image_and_text_sets(tmp_path):
    """LLaMA-Factory's examples/train_lora/qwen3vl_lora_sft.yaml, imported: mllm_demo beside identity and
    alpaca_en_demo (text only) becomes one set, the image rows with their images and the text rows with none."""
    import yaml

    from scaletrain.config.importers import from_llamafactory
    from tests.vlm import llamafactory_data

    path = save_tiny("qwen3_vl", tmp_path / "qwen3-vl")
    lf = yaml.safe_load((FIXTURES / "qwen3vl_lora_sft.yaml").read_text())
    cfg, _ = from_llamafactory({**lf, "model_name_or_path": str(path), "cutoff_len": 256,
                                "dataset_dir": str(llamafactory_data(tmp_path / "data", n=8))})
    cfg["output"] = {"output_dir": str(tmp_path / "runs")}
    tok = load_tokenizer(str(path))
    data = prepare_data(validate(cfg), tok, image_text_factory(str(path), tok))
    assert len(data.train) == 8 + 4 + 4
    with_images = [ex for ex in data.train if ex["image_tokens"]]
    assert len(with_images) == 6 and all(ex["image_refs"] for ex in with_images)  # rows 3, 7 of mllm_demo: none


QWEN_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@pytest.mark.parametrize("kind", QWEN_KINDS)
@pytest.mark.parametrize("attention", ["by-example", "block-mask"])
def test_packed_image_rows_give_the_unpacked_loss(tmp_path, kind, attention):
    """Several examples with images in one row: each example's own 3-D M-RoPE positions (the model's
    get_rope_index on it alone) and attention kept inside it give the padded batch's loss (1e-6, fp32)."""
    import datasets
    from transformers import AutoModelForImageTextToText

    from scaletrain.data import model_inputs
    from scaletrain.data.packing import pack
    from scaletrain.model import attention as by_example
    from scaletrain.model.vision import packed_positions, rope_owner
    from scaletrain.worker.step import token_loss_sum

    path = save_tiny(kind, tmp_path / kind)
    tok = load_tokenizer(str(path))
    data = _prepare(path, tok, mllm_demo(tmp_path / "data", n=8), tmp_path)
    examples = [data.train[i] for i in range(len(data.train))]
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    twin = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    if attention == "by-example":
        assert by_example.isolate_examples(twin) == by_example.NAME
    padded = collator(path, tok)(examples)
    rows = pack(datasets.Dataset.from_list(examples), 256, seed=1, workdir=tmp_path)
    packed = collator(path, tok)([rows[i] for i in range(len(rows))])
    assert packed["input_ids"].shape[0] < len(examples) and "attention_mask" not in packed
    assert torch.equal(packed["image_grid_thw"].prod(-1).sort().values, padded["image_grid_thw"].prod(-1).sort().values)
    packed["position_ids"] = packed_positions(rope_owner(twin, twin.config), packed)
    with torch.no_grad():
        a = token_loss_sum(model(**model_inputs(padded, labels=False), use_cache=False).logits, padded["labels"])
        b = token_loss_sum(twin(**model_inputs(packed, labels=False), use_cache=False).logits, packed["labels"])
    assert int((padded["labels"][:, 1:] != IGNORE_INDEX).sum()) == int((packed["labels"][:, 1:] != IGNORE_INDEX).sum())
    assert b.item() == pytest.approx(a.item(), abs=1e-6 * a.item())


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
def test_gemma3_packed_rows_give_the_padded_loss(tmp_path, attention):
    """#73: Gemma 3 packed: each example's attention kept inside it, its images' tokens attending to each other both
    ways (the masks built per example: vision.packed_masks, through packed_inputs as the step and eval call it), the
    padded batch's loss to 1e-6; and the driver no longer refuses it."""
    import datasets
    from transformers import AutoModelForImageTextToText

    from scaletrain.config.schema import ModelConfig
    from scaletrain.data import model_inputs
    from scaletrain.data.packing import pack
    from scaletrain.model.build import packing_support_error
    from scaletrain.model.tokenizer import Vocab
    from scaletrain.model.vision import packed_inputs
    from scaletrain.worker.step import token_loss_sum

    path = save_tiny("gemma3", tmp_path / "gemma3")
    tok = load_tokenizer(str(path))
    assert packing_support_error(ModelConfig(name_or_path=str(path), task="causal-lm"), Vocab.of(tok)) is None
    data = _prepare(path, tok, mllm_demo(tmp_path / "data", n=8), tmp_path)
    examples = [data.train[i] for i in range(len(data.train))]
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32,
                                                        attn_implementation=attention).eval()
    padded = collator(path, tok)(examples)
    rows = pack(datasets.Dataset.from_list(examples), 256, seed=1, workdir=tmp_path)
    packed = collator(path, tok)([rows[i] for i in range(len(rows))])
    assert packed["input_ids"].shape[0] < len(examples) and "attention_mask" not in packed
    packed = packed_inputs(packed, masks_of=model.config)
    with torch.no_grad():
        a = token_loss_sum(model(**model_inputs(padded, labels=False), use_cache=False).logits, padded["labels"])
        b = token_loss_sum(model(**model_inputs(packed, labels=False), use_cache=False).logits, packed["labels"])
    assert b.item() == pytest.approx(a.item(), abs=1e-6 * a.item())


def test_plan_counts_an_images_tokens_as_the_data_step_does_and_the_towers_cost(model, tmp_path):
    from transformers import AutoConfig

    from scaletrain.model.processor import image_text
    from scaletrain.model.vision import image_plan, image_plan_line

    kind, path, tok = model
    config = AutoConfig.from_pretrained(str(path))
    facts = image_plan(config, 112 * 112, 256, tower_trains=False)
    side = facts["side"]
    assert facts["tokens"] == image_text(str(path), config, tok).preprocess([image(side, side)])["tokens"][0]
    assert facts["per_sequence"] == 256 // facts["tokens"] and facts["activation_bytes"] == 0
    trained = image_plan(config, 112 * 112, 256, tower_trains=True)
    assert trained["activation_bytes"] > 0 and trained["forward_flops"] == facts["forward_flops"] > 0
    line = image_plan_line(facts, 112 * 112, False)
    assert f"{facts['tokens']} tokens of the sequence" in line and "frozen" in line


def test_preference_pairs_with_images_encode_each_side_as_sft_does(tmp_path):
    """LLaMA-Factory's rlhf_v shape (train.stage: dpo): each side is the prompt with its reply, token for token the
    SFT encoding of that conversation, its labels the reply only; the collated batch carries the images once per
    side (the chosen rows', then the rejected rows')."""
    from tests.vlm import rlhf_v

    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = rlhf_v(tmp_path / "data", n=4)
    cfg = validate({"model": {"name_or_path": str(path), "task": "causal-lm"}, "train": {"stage": "dpo"},
                    "data": {"dataset_dir": str(demo), "dataset": ["rlhf_v"], "eval_ratio": 0, "max_length": 256},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    data = prepare_data(cfg, tok, image_text_factory(str(path), tok))
    rows = json.loads((demo / "rlhf_v.json").read_text())
    assert len(data.train) == 4
    for ex in data.train:
        row = next(r for r in rows if tok.decode([t for t in ex["chosen_labels"] if t != IGNORE_INDEX]).startswith(
            r["chosen"]["value"]))
        ref = _reference("qwen2_vl", tok, {"messages": [{"role": "user", "content": row["conversations"][0]["value"]},
                                                        {"role": "assistant", "content": row["chosen"]["value"]}],
                                           "images": row["images"]}, demo)
        assert ex["chosen_input_ids"] == list(ref["input_ids"][0])
        rejected = tok.decode([t for t in ex["rejected_labels"] if t != IGNORE_INDEX])
        assert rejected.startswith(row["rejected"]["value"])
    batch = collator(path, tok)([data.train[i] for i in range(2)])
    grids = batch["image_grid_thw"]
    assert batch["input_ids"].shape[0] == 4 and torch.equal(grids[:2], grids[2:])
    assert int(batch["mm_token_type_ids"].sum()) == 2 * sum(sum(data.train[i]["image_tokens"]) for i in range(2))


def test_image_keys_on_a_text_model_are_one_line_before_the_data_is_read(tmp_path):
    from scaletrain.errors import ConfigError
    from scaletrain.launch.preflight import preflight
    from tests.conftest import save_tiny_llama

    text_model = save_tiny_llama(tmp_path / "llama")
    cfg = validate({"model": {"name_or_path": str(text_model), "task": "causal-lm"},
                    "data": {"train_file": str(tmp_path / "none.json"), "image_max_pixels": 262144},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    with pytest.raises(ConfigError) as e:
        preflight(cfg)
    said = str(e.value)
    assert said.startswith("data.image_max_pixels=262144: model.name_or_path=") and "is a text model" in said
    assert len(said.splitlines()) == 1


def test_frozen_parts_get_no_gradient_from_a_batch_with_images(tmp_path):
    """Full fine-tuning with LLaMA-Factory's defaults, a batch with images through forward and backward: the tower
    and the projector have no gradient, every language-model parameter has one, and what trains is the language
    model's count."""
    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.build import build_model
    from scaletrain.model.tokenizer import Vocab
    from scaletrain.model.vision import counts, parts

    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    data = _prepare(path, tok, mllm_demo(tmp_path / "data", n=4), tmp_path)
    model = build_model(ModelConfig(name_or_path=str(path), task="causal-lm", finetuning_type="full"), Vocab.of(tok))
    batch = collator(path, tok)([data.train[i] for i in range(len(data.train))])
    assert "pixel_values" in batch
    from scaletrain.data import model_inputs

    model(**model_inputs(batch)).loss.backward()
    by_part = parts(model)
    assert all(p.grad is None for part in ("vision", "projector") for _, p in by_part[part])
    assert all(p.grad is not None for _, p in by_part["language"])
    assert counts(model)["language"][0] == sum(p.numel() for _, p in by_part["language"]) == sum(
        p.numel() for p in model.parameters() if p.requires_grad)


def test_a_resumed_text_runs_resolved_config_with_every_default_is_not_an_image_job(tmp_path):
    """A resolved config (what --resume reads) names every data key at its default: not a mistake (only a value
    other than the default is)."""
    from scaletrain.errors import ScaletrainError
    from scaletrain.launch.preflight import preflight
    from tests.conftest import save_tiny_llama

    text_model = save_tiny_llama(tmp_path / "llama")
    cfg = validate({"model": {"name_or_path": str(text_model), "task": "causal-lm"},
                    "data": {"train_file": str(tmp_path / "none.json"), "image_max_pixels": 768 * 768,
                             "image_min_pixels": 32 * 32, "media_dir": None},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    with pytest.raises(ScaletrainError) as e:  # it gets as far as the data: the file is missing
        preflight(cfg)
    assert "image" not in str(e.value) and "none.json" in str(e.value)


@pytest.mark.slow  # three data steps of a tiny VLM: make test, not make test-fast
def test_image_parts_of_v1_messages_train_as_llamafactorys_rows_and_a_text_model_refuses_them(tmp_path):
    """#76: LLaMA-Factory v1's image parts ({"type": "image_url", "value": PATH}, and OpenAI's {"image_url":
    {"url"}}) train as the same rows written with <image> placeholders and an images column; on a text model the
    file is one line."""
    path = save_tiny("qwen2_vl", tmp_path / "m")
    tok = load_tokenizer(str(path))
    demo = mllm_demo(tmp_path / "data", n=4)
    rows = json.loads((demo / "mllm_demo.json").read_text())
    v1 = []
    for k, row in enumerate(rows):
        images = iter(str(demo / name) for name in row["images"])
        messages = []
        for m in row["messages"]:
            pieces, parts = m["content"].split("<image>"), []
            for j, piece in enumerate(pieces):
                if j:
                    src = next(images)
                    parts.append({"type": "image_url", "value": src} if k % 2 else
                                 {"type": "image_url", "image_url": {"url": src}})
                if piece:
                    parts.append({"type": "text", "value": piece})
            messages.append({"role": m["role"], "content": parts})
        v1.append({"messages": messages})
    (tmp_path / "v1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in v1))

    def prepared(model, out):
        cfg = validate({"model": {"name_or_path": str(model), "task": "causal-lm"},
                        "data": {"train_file": str(tmp_path / "v1.jsonl"), "formatting": "messages",
                                 "eval_ratio": 0, "max_length": 256},
                        "output": {"output_dir": str(tmp_path / out)}})
        return prepare_data(cfg, load_tokenizer(str(model)), image_text_factory(str(model), load_tokenizer(
            str(model))))

    ours, theirs = prepared(path, "v1runs").train, _prepare(path, tok, demo, tmp_path).train
    assert sorted(ours["input_ids"]) == sorted(theirs["input_ids"])
    by_ids = {tuple(r["input_ids"]): r for r in theirs}
    for r in ours:  # every column: labels, the images' references or pixels, their grids
        same = by_ids[tuple(r["input_ids"])]
        assert set(r) == set(same) and all(r[k] == same[k] for k in r if k != "images"), sorted(r)
    with pytest.raises(DataError, match="its rows have an 'images' column, and model.name_or_path is a text model"):
        prepared("builtin:tiny-llama", "text")

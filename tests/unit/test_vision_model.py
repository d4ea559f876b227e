"""#62 item 1: the parts of tiny Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3 models built from config: every
parameter in exactly one part, LLaMA-Factory's freeze flags and defaults (the tower and the projector frozen),
LoRA only in the unfrozen parts, and the trainable count per part equal to the analytic count."""

import pytest
import torch

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.model import vision
from scaletrain.model.build import build_model, trained_model_config
from scaletrain.model.tokenizer import Vocab, load_tokenizer
from tests.vlm import save_tiny

KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3")


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    return request.param, save_tiny(request.param, tmp_path_factory.mktemp(request.param))


def _build(path, **model):
    cfg = validate({"model": {"name_or_path": str(path), "task": "causal-lm", **model},
                    "data": {"train_file": "x.jsonl"}})
    tok = load_tokenizer(str(path))
    return build_model(trained_model_config(cfg.model, "sft"), Vocab.of(tok))


def _tower(model, kind):
    inner = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
    return inner.vision_tower if kind == "gemma3" else inner.visual


def test_full_fine_tuning_freezes_the_tower_and_the_projector_by_default(tiny):
    kind, path = tiny
    model = _build(path, finetuning_type="full")
    tower = _tower(model, kind)
    counted = vision.counts(model)
    everything = sum(p.numel() for p in model.parameters())
    assert sum(total for _, total in counted.values()) == everything  # every parameter in one part
    assert counted["vision"][0] == 0 and counted["projector"][0] == 0
    assert counted["language"][0] == counted["language"][1] == sum(
        p.numel() for p in model.model.language_model.parameters()) + (
        0 if model.lm_head.weight is model.model.language_model.embed_tokens.weight else model.lm_head.weight.numel())
    # the tower and projector together: every parameter under the vision module (Qwen: the mergers inside it)
    inside = sum(p.numel() for p in tower.parameters())
    projector = 0 if kind != "gemma3" else sum(p.numel() for p in model.model.multi_modal_projector.parameters())
    assert counted["vision"][1] + counted["projector"][1] == inside + projector
    assert all(not p.requires_grad for p in tower.parameters())  # Qwen3-VL's pos_embed and deepstack mergers too
    line = vision.counts_line(model)
    assert line.startswith("vision 0 of ") and "language" in line


def test_the_flags_unfreeze_what_they_name(tiny):
    kind, path = tiny
    model = _build(path, finetuning_type="full", freeze_vision_tower=False, freeze_language_model=True)
    counted = vision.counts(model)
    assert counted["vision"][0] == counted["vision"][1] > 0 and counted["language"][0] == 0
    assert counted["projector"][0] == 0


def test_lora_adapts_the_language_model_only_unless_asked(tiny):
    kind, path = tiny
    model = _build(path, finetuning_type="lora", lora_rank=4)
    adapted = [n for n, p in model.named_parameters() if p.requires_grad]
    assert adapted and all("lora_" in n for n in adapted)
    layout = vision.layout_of(model.config)
    assert {vision.part_of(n, layout) for n in adapted} == {"language"}
    both = _build(path, finetuning_type="lora", lora_rank=4, freeze_vision_tower=False)
    parts = {vision.part_of(n, layout) for n, p in both.named_parameters() if p.requires_grad}
    assert parts == {"language", "vision"}
    with pytest.raises(ConfigError, match="nothing to adapt in the unfrozen parts \\(none\\)"):
        _build(path, finetuning_type="lora", freeze_language_model=True)


def test_a_parameter_in_no_part_is_an_error_never_left_trainable():
    layout = vision.LAYOUTS["qwen2_vl"]
    assert vision.part_of("model.visual.merger.mlp.0.weight", layout) == "projector"  # the longest prefix wins
    assert vision.part_of("model.visual.blocks.0.attn.qkv.weight", layout) == "vision"
    assert vision.part_of("base_model.model.lm_head.weight", layout) == "language"
    assert vision.part_of("model.audio_tower.x", layout) is None
    model = torch.nn.Module()
    model.config = type("C", (), {"model_type": "qwen2_vl"})()
    model.register_parameter("stray", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(ConfigError, match="the parameter stray of this qwen2_vl is in none of its parts"):
        vision.parts(model)

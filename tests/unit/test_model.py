"""model.lora_target checked in the driver against an empty copy of the model."""

import pytest

from scaletrain.config.schema import ModelConfig
from scaletrain.errors import ConfigError
from scaletrain.model.build import check_lora_target
from scaletrain.model.tokenizer import Vocab


def _lora(target, name="builtin:tiny-llama", task="causal-lm"):
    return ModelConfig(name_or_path=name, task=task, finetuning_type="lora", lora_target=target)


def test_lora_targets_that_name_modules_pass():
    check_lora_target(_lora(["q_proj", "v_proj"]), Vocab(256, 0))
    check_lora_target(_lora(["self_attn.q_proj", "mlp.down_proj"]), Vocab(256, 0))  # PEFT matches dotted suffixes too
    check_lora_target(_lora("all-linear"), Vocab(256, 0))
    full = ModelConfig(name_or_path="builtin:tiny-llama", task="causal-lm", lora_target=["x"])
    check_lora_target(full, Vocab(256, 0))


def test_each_missing_target_is_named_with_the_layers_there_are():
    with pytest.raises(ConfigError) as e:
        check_lora_target(_lora(["q_proj", "vproj", "attn.q_proj"]), Vocab(256, 0))
    msg = str(e.value)
    assert msg.startswith("model.lora_target: vproj, attn.q_proj names no module of builtin:tiny-llama")
    assert "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in msg


def test_a_stored_head_of_another_size_is_found_from_the_weights(tmp_path):
    """transformers 5 writes no id2label/num_labels for its default of 2 labels: the head's rows are read from the
    safetensors header, so a 3-class run on it re-initialises the head (said at start) instead of failing in the
    worker in transformers' words."""
    import json

    from transformers import AutoModelForSequenceClassification, BertConfig

    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.build import build_model
    from scaletrain.model.files import head_mismatch
    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin:minilm")
    saved = AutoModelForSequenceClassification.from_config(BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    saved.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "id2label" not in config and "num_labels" not in config  # what makes the config alone say nothing
    three = ModelConfig(name_or_path=str(tmp_path), task="sequence-classification", num_labels=3)
    assert head_mismatch(three) == 2
    assert head_mismatch(three.model_copy(update={"num_labels": 2})) is None
    model = build_model(three, Vocab.of(tok), ["a", "b", "c"])
    assert model.classifier.out_features == 3

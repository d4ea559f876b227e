"""model.lora_target checked in the driver against an empty copy of the model."""

import pytest

from scaletrain.config.schema import ModelConfig
from scaletrain.errors import ConfigError
from scaletrain.model import check_lora_target
from scaletrain.tokenizer import Vocab


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

"""The plan knows Mixture-of-Experts: Qwen3-30B-A3B's released config.json (alone: no weights, no tokenizer) holds
30.5B parameters of which 3.3B compute per token (8 of 128 experts); memory counts all, FLOPs the active ones."""

import json

import pytest

from scaletrain.config import validate
from scaletrain.memory.plan import ASSUMED_MFU, device_named, shape_for, step_time_s
from scaletrain.metrics.flops import PEAK_TFLOPS
from scaletrain.model.moe import Experts, active_parameters, experts_of, is_routed_expert
from scaletrain.model.tokenizer import plan_vocab

# huggingface.co/Qwen/Qwen3-30B-A3B, config.json (the fields that shape the model)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
                 "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "norm_topk_prob": True, "tie_word_embeddings": False, "max_position_embeddings": 40960,
                 "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001,
                 "output_router_logits": False, "torch_dtype": "bfloat16", "bos_token_id": 151643,
                 "eos_token_id": 151645}

# The arithmetic: per layer, attention q/o 2 x 2048 x 4096 and k/v 2 x 2048 x 512, norms 2 x 2048 + q/k norms
# 2 x 128; the router 128 x 2048; each expert 3 x 2048 x 768. Outside the layers: untied embedding and head
# 2 x 151936 x 2048, the final norm 2048.
ATTENTION = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 2048 + 2 * 128
EXPERT = 3 * 2048 * 768
ROUTER = 128 * 2048
OUTSIDE = 2 * 151936 * 2048 + 2048
TOTAL = 48 * (ATTENTION + ROUTER + 128 * EXPERT) + OUTSIDE
ACTIVE = 48 * (ATTENTION + ROUTER + 8 * EXPERT) + OUTSIDE


def test_the_arithmetic_is_the_published_size():
    # the model card's "30.5B total, 3.3B activated": 3.35B here, rounded down there
    assert round(TOTAL / 1e9, 1) == 30.5 and 3.3e9 < ACTIVE < 3.4e9
    assert experts_of(QWEN3_30B_A3B) == Experts(128, 8) and experts_of({"model_type": "llama"}) is None


@pytest.fixture(scope="module")
def moe_cfg(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3-30b-a3b")
    (d / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    return validate({"model": {"name_or_path": str(d), "task": "causal-lm", "finetuning_type": "full"},
                     "data": {"train_file": "unused.jsonl", "max_length": 4096},
                     "train": {"strategy": "fsdp", "bf16": True, "per_device_train_batch_size": 1,
                               "gradient_checkpointing": True}})


@pytest.mark.slow  # a meta pass over 48 layers of 128 experts: seconds each
@pytest.mark.parametrize("device", ["h100-sxm", "mi300x"])
def test_plan_counts_all_experts_in_memory_and_the_active_ones_in_flops(moe_cfg, device):
    shape = shape_for(moe_cfg, plan_vocab(moe_cfg.model.name_or_path))
    assert (shape.total, shape.active_total, shape.experts) == (TOTAL, ACTIVE, (128, 8))
    assert shape.block_params == ATTENTION + ROUTER + 128 * EXPERT
    assert shape.block_compute_params == ATTENTION + ROUTER + 8 * EXPERT
    # step time = (6 x active non-embedding + attention 12 L d S + the checkpointed forward again 2 x active) per
    # token x 4096 tokens / (peak x the assumed MFU)
    active_blocks = 48 * (ATTENTION + ROUTER + 8 * EXPERT)
    per_token = 6 * active_blocks + 12 * 48 * 2048 * 4096 + 2 * active_blocks
    dev = device_named(device)
    expected = per_token * 4096 / (PEAK_TFLOPS[dev.key]["bf16"] * 1e12 * ASSUMED_MFU)
    assert step_time_s(moe_cfg, shape, dev, "bf16") == pytest.approx(expected, rel=1e-9)
    assert "128 routed experts, 8 per token: 30.5B parameters held (memory), 3.4B active" in shape.moe_line()


@pytest.mark.slow
def test_lora_on_fused_experts_is_planned_without_a_traceback(moe_cfg):
    lora = moe_cfg.model_copy(update={"model": moe_cfg.model.model_copy(update={"finetuning_type": "lora",
                                                                                 "lora_target": ["q_proj", "v_proj"]})})
    shape = shape_for(lora, plan_vocab(lora.model.name_or_path))
    assert shape.total > TOTAL and shape.trainable < 1e8 and shape.experts == (128, 8)


def test_routed_experts_are_told_from_shared_experts_and_the_router():
    e = Experts(4, 2)
    assert is_routed_expert("model.layers.0.mlp.experts.gate_up_proj", (4, 64, 32), e)
    assert is_routed_expert("model.layers.0.block_sparse_moe.experts.3.w1.weight", (16, 32), e)  # Mixtral's
    assert not is_routed_expert("model.layers.0.mlp.shared_expert.gate_proj.weight", (16, 32), e)
    assert not is_routed_expert("model.layers.0.mlp.gate.weight", (4, 32), e)

    class P:
        def __init__(self, *shape):
            self.shape = shape

        def numel(self):
            n = 1
            for s in self.shape:
                n *= s
            return n

    named = [("mlp.experts.down_proj", P(4, 32, 16)), ("mlp.gate.weight", P(4, 32))]
    assert active_parameters(named, e) == (4 * 32 * 16 + 128, 2 * 32 * 16 + 128)

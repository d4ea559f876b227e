"""LoRA on Mixture-of-Experts models adapts what it says: by default attention and the routed experts (fused
expert weights through peft's target_parameters), never the router unless asked; a target that names experts on
a dense model is one line. Tiny Qwen3-MoE, Mixtral and gpt-oss configs of the installed transformers."""

import warnings

import pytest
import torch

from scaletrain.config.schema import ModelConfig
from scaletrain.errors import ConfigError
from scaletrain.model.build import apply_lora, lora_summary


def _model(family: str):
    from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig, MixtralConfig, Qwen3MoeConfig

    common = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    config = {"qwen3_moe": lambda: Qwen3MoeConfig(**common, intermediate_size=64, moe_intermediate_size=16,
                                                  num_experts=4, num_experts_per_tok=2, head_dim=8),
              "mixtral": lambda: MixtralConfig(**common, intermediate_size=64, num_local_experts=4,
                                               num_experts_per_tok=2),
              "gpt_oss": lambda: GptOssConfig(**common, intermediate_size=32, num_local_experts=4,
                                              num_experts_per_tok=2, head_dim=8),
              "llama": lambda: LlamaConfig(**common, intermediate_size=64)}[family]()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _lora(model, target="all-linear"):
    cfg = ModelConfig(name_or_path="builtin:tiny-llama", task="causal-lm", finetuning_type="lora", lora_rank=4,
                      lora_alpha=8, lora_target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # peft's "rank_pattern keys did not match": never
        return apply_lora(model, cfg)


def _trained(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_the_default_adapts_attention_and_experts_not_the_router(family):
    adapted = _lora(_model(family))
    trained = _trained(adapted)
    assert any(".self_attn.q_proj.lora_A" in n for n in trained)
    assert any(".experts.lora_A" in n for n in trained)  # the fused expert weights (gate_up_proj's and down_proj's)
    assert any(".experts.base_layer.lora_A" in n for n in trained)
    assert not any(".gate." in n or ".router." in n for n in trained), sorted(trained)
    summary = lora_summary(adapted)
    assert summary["lora/router_adapted"] is False
    assert summary["lora/expert_parameters"] == ["experts.down_proj", "experts.gate_up_proj"]
    assert summary["lora/expert_tensors_adapted"] == 4  # 2 layers x (gate_up_proj, down_proj)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_the_router_is_adapted_only_when_asked(family):
    trained = _trained(_lora(_model(family), ["attention", "experts", "router"]))
    router = "router" if family == "gpt_oss" else "gate"
    assert any(f".mlp.{router}.lora_A" in n for n in trained), sorted(trained)
    assert lora_summary(_lora(_model(family), ["attention", "router"]))["lora/router_adapted"] is True


def test_attention_alone_leaves_the_experts_frozen():
    trained = _trained(_lora(_model("qwen3_moe"), ["attention"]))
    assert trained and all(".self_attn." in n for n in trained)


def test_experts_on_a_dense_model_is_one_line():
    with pytest.raises(ConfigError, match="model.lora_target: experts names the experts or router of a "
                                          "Mixture-of-Experts model, and builtin:tiny-llama is dense"):
        _lora(_model("llama"), ["q_proj", "experts"])
    assert _trained(_lora(_model("llama")))  # all-linear on a dense model: peft's own shorthand, as before


def test_the_start_of_run_note_says_what_is_adapted(tmp_path):
    from scaletrain.model.build import check_lora_target
    from scaletrain.model.tokenizer import Vocab

    _model("qwen3_moe").config.save_pretrained(tmp_path)
    cfg = ModelConfig(name_or_path=str(tmp_path), task="causal-lm", finetuning_type="lora", lora_rank=4)
    note = check_lora_target(cfg, Vocab(128, 0))
    assert note == ("LoRA (rank 4) on k_proj, o_proj, q_proj, v_proj; the routed experts' experts.down_proj, "
                    "experts.gate_up_proj (4 fused tensors, rank 4 per expert); the router frozen "
                    "(model.lora_target: router adapts it)")
    with pytest.raises(ConfigError, match="gate_upproj names no module"):
        check_lora_target(cfg.model_copy(update={"lora_target": ["q_proj", "gate_upproj"]}), Vocab(128, 0))


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_lora_on_the_experts_stays_on_the_grouped_gemm(family, monkeypatch):
    """transformers computes fused experts with one grouped GEMM per projection (grouped_mm); LoRA on them (peft's
    target_parameters) adapts the weight that kernel reads, so a LoRA forward makes the same grouped calls as the
    base model's (2 layers x 2 projections), never a per-expert loop; the start-of-run line names the kernel."""
    import transformers.integrations.moe as moe

    from scaletrain.model.build import experts_kernel

    calls = []
    grouped = moe._grouped_mm
    monkeypatch.setattr(moe, "_grouped_mm", lambda *a, **k: calls.append(1) or grouped(*a, **k))
    ids = torch.randint(0, 128, (2, 8))
    base = _model(family)
    assert experts_kernel(base, "cpu").startswith("experts: grouped_mm (torch's grouped GEMM on cpu")
    base(ids)
    assert len(calls) == 4
    calls.clear()
    _lora(_model(family))(ids)
    assert len(calls) == 4
    assert experts_kernel(_model("llama"), "cpu") is None  # dense: nothing to say


def test_the_kernel_line_names_the_fallback_and_the_per_expert_loop(monkeypatch):
    import transformers.integrations.moe as moe

    from scaletrain.model.build import experts_kernel

    model = _model("qwen3_moe")
    monkeypatch.setattr(moe, "_can_use_grouped_mm", lambda *a: False)
    assert "through transformers' fallback (torch " in experts_kernel(model, "cpu", torch.bfloat16)
    assert "for cpu/bfloat16: one matmul per active expert" in experts_kernel(model, "cpu", torch.bfloat16)
    model.config._experts_implementation = "eager"
    assert experts_kernel(model, "cpu").startswith("experts: eager (this model class's own expert computation")

"""`scaletrain export` of a LoRA run on a Mixture-of-Experts model: the LoRA on the fused experts (peft's
target_parameters) is merged into the experts as the base checkpoint stores them (Qwen3-MoE's and Mixtral's one
tensor per expert and projection, gpt-oss's fused tensors), equal to peft's merge_and_unload saved by
transformers (fp32) within one bf16 ulp; every expert changes; the export loads as a plain model and computes what the
adapted model computes. Tiny bf16 checkpoints of the installed transformers' configs."""

import pytest
import torch
import yaml

from scaletrain.after.export import export_run, shards_of
from tests.unit.test_export import _load, _within_one_ulp
from tests.unit.test_moe_lora import _lora, _model

# Where each family's checkpoint keeps an expert weight: one tensor per expert, or the fused one.
EXPERT_KEYS = {"qwen3_moe": ["model.layers.1.mlp.experts.3.gate_proj.weight",
                             "model.layers.1.mlp.experts.3.up_proj.weight",
                             "model.layers.0.mlp.experts.0.down_proj.weight"],
               "mixtral": ["model.layers.1.block_sparse_moe.experts.3.w1.weight",
                           "model.layers.1.block_sparse_moe.experts.3.w3.weight",
                           "model.layers.0.block_sparse_moe.experts.0.w2.weight"],
               "gpt_oss": ["model.layers.1.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"]}


def _moe_run(tmp_path, family, target="all-linear"):
    """A finished LoRA run on a tiny bf16 MoE checkpoint: the adapter as training leaves it (B non-zero)."""
    base = tmp_path / "base"
    _model(family).to(torch.bfloat16).save_pretrained(base)
    adapted = _lora(_model(family).to(torch.float32), target)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.05)
    run = tmp_path / "run"
    adapted.save_pretrained(run / "final")
    (run / "config.resolved.yaml").write_text(yaml.safe_dump({"model": {"name_or_path": str(base)}}))
    return base, run


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_expert_lora_merges_into_the_checkpoints_own_expert_tensors(tmp_path, family):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, run = _moe_run(tmp_path, family)
    done = export_run(run)
    ours, before = _load(done.path), _load(base)
    assert set(ours) == set(before)  # the base's own key names and layout
    reference_dir = tmp_path / "reference"
    # peft's merge in fp32: merged in bf16 it computes the experts' einsum in bf16 and is itself 1-2 ulps off
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                              run / "final").merge_and_unload().save_pretrained(reference_dir)
    reference = _load(reference_dir)
    for key, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16 and _within_one_ulp(tensor, reference[key]), key
    changed = {k for k in ours if not torch.equal(ours[k], before[k])}
    assert set(EXPERT_KEYS[family]) <= changed  # every expert's weights, in both layers
    assert len(changed) == done.merged
    experts = [k for k in before if ".experts." in k and "bias" not in k]
    assert set(experts) <= changed, sorted(set(experts) - changed)[:3]
    assert not any(".gate." in k or ".router." in k for k in changed)  # the router was not adapted


def test_the_export_computes_what_the_adapted_model_computes(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, run = _moe_run(tmp_path, "qwen3_moe")
    done = export_run(run, dtype="fp32")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    exported = AutoModelForCausalLM.from_pretrained(done.path, dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                        run / "final").eval()
    with torch.no_grad():
        assert torch.allclose(exported(ids).logits, adapted(ids).logits, atol=1e-4)
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()(ids).logits
    assert not torch.allclose(exported(ids).logits, plain, atol=1e-3)  # the adapter did change the model


def test_the_router_adapted_on_mixtral_lands_under_its_checkpoint_name(tmp_path):
    base, run = _moe_run(tmp_path, "mixtral", ["attention", "experts", "router"])
    done = export_run(run)
    ours, before = _load(done.path), _load(base)
    assert set(ours) == set(before)
    key = "model.layers.0.block_sparse_moe.gate.weight"  # the model calls it mlp.gate
    assert not torch.equal(ours[key], before[key])
    assert len(shards_of(done.path)) == 1

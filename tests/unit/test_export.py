"""`scaletrain export`: a LoRA run merged into its base one safetensors shard at a time equals peft's
merge_and_unload within one bf16 ulp, with the index, config (its dtype), tokenizer and chat template beside it;
host memory grows by about two shards, not the model; a full fine-tune's final/ is copied (cast when asked); the
bad inputs are one line each and nothing is overwritten."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from scaletrain.after.export import export_run, shards_of
from scaletrain.errors import ConfigError

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def _base(path: Path, hidden=64, layers=4, intermediate=128, shard="60KB", vocab=512) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=intermediate)
                     ).to(torch.bfloat16).save_pretrained(path, max_shard_size=shard)
    return path


def _run(tmp_path: Path, base: Path, *, rslora=False, save=None, targets=("q_proj", "v_proj", "down_proj"),
         dora=False) -> Path:
    """A finished LoRA run's directory: final/ with the adapter (B made non-zero, as training leaves it), the
    tokenizer with the run's template, and the resolved config naming the base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(targets), use_rslora=rslora,
                                            modules_to_save=save, use_dora=dora))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.05)
            elif "lora_magnitude_vector" in name:  # DoRA: training moves the magnitudes too
                p.mul_(1 + torch.randn_like(p) * 0.05)
    peft.save_pretrained(run / "final")
    tok = tiny_llama_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(run / "final")
    (run / "config.resolved.yaml").write_text(yaml.safe_dump({"model": {"name_or_path": str(base)}}))
    return run


def _load(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for name in shards_of(directory):
        out.update(load_file(str(directory / name)))
    return out


def _within_one_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    big = torch.maximum(a.abs(), b.abs()).clamp_min(2.0 ** -126)
    ulp = 2.0 ** (torch.floor(torch.log2(big)) - 7)  # bf16: 8 significant bits
    return bool(((a - b).abs() <= ulp).all())


@pytest.mark.parametrize("rslora,save,dora", [(False, None, False), (True, ["lm_head"], False), (False, None, True)])
def test_a_merged_export_equals_peft_merge_and_unload(tmp_path, rslora, save, dora):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = _base(tmp_path / "base")
    assert len(shards_of(base)) >= 4
    run = _run(tmp_path, base, rslora=rslora, save=save, dora=dora)
    done = export_run(run)
    assert done.path == run / "export" and done.shards == len(shards_of(base)) and done.dtype == "bf16"
    assert done.merged == 3 * 4 and done.replaced == (1 if save else 0)
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16),
                                          run / "final").merge_and_unload().state_dict()
    ours = _load(done.path)
    assert set(ours) == {k for k in reference if k != "lm_head.weight" or "lm_head.weight" in ours}
    for key, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16 and _within_one_ulp(tensor, reference[key]), key
    changed = [k for k in ours if not torch.equal(ours[k], _load(base)[k])]
    assert len(changed) == done.merged + done.replaced  # the adapted weights, nothing else
    config = json.loads((done.path / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert json.loads((done.path / "model.safetensors.index.json").read_text())["metadata"]["total_size"] == done.bytes
    assert AutoTokenizer.from_pretrained(done.path).chat_template == TEMPLATE  # the template the run trained with
    model = AutoModelForCausalLM.from_pretrained(done.path)  # a standalone model directory
    assert model.dtype == torch.bfloat16


def test_export_never_overwrites_and_names_what_is_missing(tmp_path):
    base = _base(tmp_path / "base")
    run = _run(tmp_path, base)
    export_run(run)
    with pytest.raises(ConfigError, match="exists; an export never overwrites"):
        export_run(run)
    with pytest.raises(ConfigError, match="--dtype int8: choose fp32, bf16, fp16"):
        export_run(run, tmp_path / "x", "int8")
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.resolved.yaml").write_text("model: {name_or_path: x}\n")
    with pytest.raises(ConfigError, match="no final/ .*did not finish"):
        export_run(tmp_path / "unfinished")
    moved = tmp_path / "base-moved"
    base.rename(moved)
    with pytest.raises(ConfigError, match="base model the run trained from is not where it recorded it"):
        export_run(run, tmp_path / "y")
    assert not (tmp_path / "y").exists() and not any(p.name.startswith(".partial") for p in tmp_path.iterdir())


def test_an_adapter_of_another_base_is_refused_with_the_weight(tmp_path):
    run = _run(tmp_path, _base(tmp_path / "base"))
    other = _base(tmp_path / "other", layers=2)
    settings = json.loads((run / "final" / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = str(other)
    (run / "final" / "adapter_config.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match=r"changes \d+ weight\(s\) the base checkpoint .* does not hold"):
        export_run(run, tmp_path / "z")
    assert not (tmp_path / "z").exists()


def test_a_full_fine_tune_is_copied_and_cast_shard_by_shard(tmp_path):
    run = tmp_path / "full"
    _base(run / "final")
    (run / "config.resolved.yaml").write_text("model: {name_or_path: x}\n")
    same = export_run(run, tmp_path / "same")
    assert same.dtype == "bf16" and same.merged == 0
    fp32 = export_run(run, tmp_path / "fp32", "fp32")
    a, b = _load(run / "final"), _load(fp32.path)
    assert all(b[k].dtype == torch.float32 and torch.equal(b[k], a[k].float()) for k in a)
    assert json.loads((fp32.path / "config.json").read_text())["dtype"] == "float32"


def test_the_export_command_says_what_it_wrote(tmp_path, capsys):
    from scaletrain.cli import main

    run = _run(tmp_path, _base(tmp_path / "base"))
    assert main(["export", str(run), "-o", str(tmp_path / "merged"), "--dtype", "fp32"]) == 0
    out = " ".join(capsys.readouterr().err.split())  # scaletrain's lines go to stderr, as train's do
    assert f"exported {tmp_path / 'merged'}: " in out and "12 LoRA weight(s) merged, fp32" in out
    assert main(["export", "s3://bucket/runs/x"]) != 0
    assert "a run on object storage" in capsys.readouterr().err


def test_an_adapter_missing_half_a_pair_is_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    run = _run(tmp_path, _base(tmp_path / "base"))
    path = run / "final" / "adapter_model.safetensors"
    tensors = load_file(str(path))
    save_file({k: v for k, v in tensors.items() if not k.endswith("layers.0.self_attn.q_proj.lora_B.weight")},
              str(path))
    with pytest.raises(ConfigError, match=r"lora_A/lora_B for .*layers.0.self_attn.q_proj.weight and not the other"):
        export_run(run, tmp_path / "x")


def test_a_prequantized_base_needs_the_original_precision_one(tmp_path):
    """QLoRA (#63): a run trained on a pre-quantized (GPTQ) checkpoint is merged into the model it was quantized
    from, named with --base; the quantized one is refused in one line that says so."""
    import shutil

    base = _base(tmp_path / "base")
    run = _run(tmp_path, base)
    gptq = tmp_path / "base-gptq"
    shutil.copytree(base, gptq)
    config = json.loads((gptq / "config.json").read_text())
    (gptq / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq",
                                                                                   "bits": 4}}))
    with pytest.raises(ConfigError, match=r"is a pre-quantized \(gptq\) checkpoint; LoRA merges into the "
                                          r"original-precision weights it was made from: export .* --base DIR"):
        export_run(run, tmp_path / "out1", base=gptq)
    done = export_run(run, tmp_path / "out2", base=base)
    assert done.merged == 3 * 4

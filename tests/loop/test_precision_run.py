"""The precision policy on the path a real checkpoint takes: a tiny Llama saved in bf16 by the test, trained in
this process (CPU; the bf16 opt-in exercises the GPU policy with CPU autocast)."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from scaletrain.launch.local import run_in_process
from tests.conftest import local_spec


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    d = tmp_path_factory.mktemp("ckpt") / "llama-bf16"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False))
    model.to(torch.bfloat16).save_pretrained(d)  # as hub checkpoints are: bf16 on disk, torch_dtype in config
    tiny_llama_tokenizer().save_pretrained(d)
    assert json.loads((d / "config.json").read_text()).get("dtype", "bfloat16") == "bfloat16"
    return d


def _job(demo_dir, model: Path, **model_keys) -> dict:
    return {"model": {"name_or_path": str(model), "task": "causal-lm", **model_keys},
            "data": {"train_file": str(demo_dir / "alpaca.json"), "max_length": 64},
            "train": {"per_device_train_batch_size": 4, "max_steps": 1, "learning_rate": 1e-5, "seed": 3}}


def test_a_bf16_checkpoint_trains_fp32_masters_and_comes_back_bf16(tmp_path, demo_dir, bf16_llama):
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    job = {**_job(demo_dir, bf16_llama), "checkpoint": {"save_steps": 1}}
    _, _, spec = local_spec(job, tmp_path / "run")
    summary = run_in_process(spec)
    assert summary["precision/trainable_params"] == "fp32" and summary["precision/optimizer_states"] == "fp32"
    assert summary["precision/compute"] == "fp32" and summary["precision/final"] == "bf16"
    # the master weights moved: a step at lr 1e-5 on weights of ~1e-2, below bf16's resolution there, changed
    # most fp32 elements (a pure-bf16 step would leave most as they were)
    before = {k: v.float() for k, v in load_file(bf16_llama / "model.safetensors").items()}
    dcp_to_torch_save(tmp_path / "run" / "checkpoints" / "step-1" / "state", tmp_path / "full.pt")
    after = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    w = "model.layers.0.mlp.down_proj.weight"
    assert after[w].dtype == torch.float32
    changed = (after[w] != before[w]).float().mean().item()
    assert changed > 0.9, changed
    in_bf16 = (after[w].to(torch.bfloat16).float() != before[w]).float().mean().item()
    assert in_bf16 < 0.5, in_bf16  # the same update rounded to bf16 is mostly lost: why masters are fp32
    # final/ in the dtype the checkpoint came in, and it loads
    assert {v.dtype for v in load_file(tmp_path / "run" / "final" / "model.safetensors").values()} == {torch.bfloat16}
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final", dtype="auto")
    assert {p.dtype for p in final.parameters()} == {torch.bfloat16}
    assert (tmp_path / "run" / "final" / "model.safetensors").stat().st_size < 0.6 * sum(
        v.numel() * 4 for v in before.values())  # not an fp32 file twice the size


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_lora_on_a_bf16_base_holds_what_the_plan_says(tmp_path, demo_dir, bf16_llama):
    job = _job(demo_dir, bf16_llama, finetuning_type="lora", torch_dtype="bfloat16")
    job["train"]["bf16"] = True  # with model.torch_dtype=bfloat16: the GPU policy on CPU (bf16 autocast)
    cfg, _, spec = local_spec(job, tmp_path / "run")
    (tmp_path / "run" / "config.resolved.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    summary = run_in_process(spec)
    assert (summary["precision/compute"], summary["precision/frozen_params"],
            summary["precision/trainable_params"]) == ("bf16", "bf16", "fp32")
    predicted = summary["memory/predicted"]
    held_params, held_optim = summary["memory/param_bytes_per_rank"][0], summary["memory/optimizer_bytes_per_rank"][0]
    assert held_params == pytest.approx(predicted["parameters"], rel=0.02)
    assert held_optim == pytest.approx(predicted["optimizer"], rel=0.02)
    from scaletrain.report.markdown import write_report

    report = write_report(tmp_path / "run").read_text()
    assert "| precision | compute bf16, trainable fp32, frozen bf16, optimizer fp32" in report
    assert f"| parameters held | {held_params / 2**20:.1f} MiB per rank (plan " in report


def test_a_stored_dtype_that_cannot_be_read_is_one_line_before_any_worker(tmp_path, demo_dir, bf16_llama):
    import shutil

    from scaletrain.config import validate
    from scaletrain.errors import ConfigError
    from scaletrain.launch.preflight import preflight

    d = tmp_path / "odd"
    shutil.copytree(bf16_llama, d)
    config = json.loads((d / "config.json").read_text())
    config["dtype"] = "float8_e4m3"
    (d / "config.json").write_text(json.dumps(config))
    job = _job(demo_dir, d)
    with pytest.raises(ConfigError, match=r"config.json stores its weights as 'float8_e4m3', a dtype scaletrain does "
                                          r"not train from") as e:
        preflight(validate({**job, "output": {"output_dir": str(tmp_path / "runs")}}))
    assert "\n" not in str(e.value)


def test_the_dtypes_held_are_the_tables(bf16_llama):
    from scaletrain.config import validate
    from scaletrain.model.build import build_model
    from scaletrain.model.precision import policy
    from scaletrain.model.tokenizer import Vocab
    from scaletrain.worker.optim import build_optimizer

    cfg = validate({"model": {"name_or_path": str(bf16_llama), "task": "causal-lm", "finetuning_type": "lora",
                              "torch_dtype": "bfloat16"}, "data": {"train_file": "x"}, "train": {"bf16": True}})
    p = policy("cpu", True, False, "bfloat16")
    model = build_model(cfg.model, Vocab(2048, 0), frozen_dtype=p.torch_dtype("frozen"))
    frozen = {q.dtype for q in model.parameters() if not q.requires_grad}
    adapters = {n: q.dtype for n, q in model.named_parameters() if q.requires_grad}
    assert frozen == {torch.bfloat16} and adapters and set(adapters.values()) == {torch.float32}
    assert all("lora_" in n for n in adapters)
    optimizer, _ = build_optimizer(model, cfg.train, 1e-3, 10)
    x = torch.randint(0, 2048, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    optimizer.step()
    states = {v.dtype for s in optimizer.state.values() for v in s.values() if v.dim() > 0}
    assert states == {torch.float32}

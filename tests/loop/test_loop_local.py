"""The worker loop run in-process as one worker (no Ray): determinism, learning, final/ reload."""

import json

import pytest
import torch
from safetensors.torch import load_file

from scaletrain.comm.context import DistContext
from scaletrain.data import Collator, load_split
from scaletrain.launch.job import finish_final
from scaletrain.launch.local import run_in_process
from scaletrain.worker.evaluate import evaluate_model
from tests.conftest import local_spec, train_losses

CTX1 = DistContext(0, 0, 1, 1, 0, "cpu", "gloo")


def _eval_loss(model, spec, task, num_labels):
    data = load_split(spec.eval_path)
    import contextlib

    return evaluate_model(model, data, Collator(spec.pad_token_id), CTX1, 16, task, num_labels, contextlib.nullcontext)


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_same_config_same_loss_curve_and_weights(classify_cfg, tmp_path):
    _, _, a = local_spec(classify_cfg, tmp_path / "a")
    _, _, b = local_spec(classify_cfg, tmp_path / "b")
    run_in_process(a)
    run_in_process(b)
    la, lb = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert len(la) == 6 and la == lb
    wa = load_file(tmp_path / "a" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "final" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # a different seed gives a different curve: the test can fail
    classify_cfg["train"]["seed"] = 8
    _, _, c = local_spec(classify_cfg, tmp_path / "c")
    run_in_process(c)
    assert train_losses(tmp_path / "c") != la


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_classification_learns_and_final_reloads(classify_cfg, tmp_path):
    # a random-init tiny BERT needs ~50 steps before it leaves chance level on this task
    classify_cfg["train"]["max_steps"] = 80
    classify_cfg["train"]["logging_steps"] = 10
    cfg, tok, spec = local_spec(classify_cfg, tmp_path / "run")
    summary = run_in_process(spec)
    finish_final(cfg, tmp_path / "run", tok)
    losses = train_losses(tmp_path / "run")
    assert losses[-1] < losses[0] * 0.6
    assert summary["final"]["eval/accuracy"] > 0.75  # balanced binary task: chance is 0.5
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "final")
    again = _eval_loss(model, spec, "sequence-classification", 2)
    assert again["eval/loss"] == pytest.approx(summary["final"]["eval/loss"], rel=1e-5)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["final"] == summary["final"] and saved["world_size"] == 1


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_regression_head(classify_cfg, tmp_path):
    classify_cfg["model"]["num_labels"] = 1
    classify_cfg["train"]["max_steps"] = 4
    _, _, spec = local_spec(classify_cfg, tmp_path / "run")
    summary = run_in_process(spec)
    assert "eval/accuracy" not in summary["final"] and summary["final"]["eval/loss"] > 0


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_lora_sft_learns_and_adapter_reloads(demo_dir, tmp_path):
    cfg_dict = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora",
                  "lora_rank": 8, "lora_alpha": 16},
        "data": {"train_file": str(demo_dir / "alpaca.json"), "eval_ratio": 0.1, "max_length": 48},
        "train": {"per_device_train_batch_size": 8, "learning_rate": 5e-3, "max_steps": 20, "logging_steps": 5,
                  "gradient_accumulation_steps": 2},
        "output": {"merge_lora": True},
    }
    cfg, tok, spec = local_spec(cfg_dict, tmp_path / "run")
    summary = run_in_process(spec)
    finish_final(cfg, tmp_path / "run", tok)
    losses = train_losses(tmp_path / "run")
    assert losses[-1] < losses[0]
    assert summary["final"]["eval/perplexity"] > 1
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "base" / "config.json").is_file()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(final / "base"), final)
    again = _eval_loss(model, spec, "causal-lm", 2)
    assert again["eval/loss"] == pytest.approx(summary["final"]["eval/loss"], rel=1e-5)
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    reloaded = AutoPeftModelForCausalLM.from_pretrained(str(final))  # the adapter names its base: offline
    assert _eval_loss(reloaded, spec, "causal-lm", 2)["eval/loss"] == pytest.approx(summary["final"]["eval/loss"],
                                                                                 rel=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Opposite of hot?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = reloaded.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)  # no token_type_ids
    assert out.shape[1] == prompt["input_ids"].shape[1] + 3
    merged = AutoModelForCausalLM.from_pretrained(final / "merged")
    merged_loss = _eval_loss(merged, spec, "causal-lm", 2)["eval/loss"]
    assert merged_loss == pytest.approx(summary["final"]["eval/loss"], rel=1e-4)

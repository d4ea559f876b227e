"""Preference tuning run in-process (one worker, no Ray): a tiny Llama learns a synthetic preference (the right
answer chosen, a wrong one rejected) with DPO, SimPO and ORPO; LoRA DPO keeps no second copy of the weights, full
DPO a frozen reference; resume is bit-identical."""

import pytest

from scaletrain.launch.local import run_in_process
from scaletrain.metrics.records import read_jsonl
from tests.conftest import local_spec, resumes_bit_identical, train_losses

pytestmark = pytest.mark.loop


def _cfg(demo_dir, loss: str, finetuning: str = "lora", steps: int = 40) -> dict:
    return {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": finetuning},
            "data": {"train_file": str(demo_dir / "preference.jsonl"), "template": "chatml", "max_length": 64,
                     "eval_ratio": 0.1},
            "train": {"stage": "dpo", "pref_loss": loss, "per_device_train_batch_size": 8, "max_steps": steps,
                      "learning_rate": 5e-3 if finetuning == "lora" else 1e-3, "logging_steps": 1,
                      "pref_beta": 0.1 if loss != "orpo" else 0.5},
            "scaling": {"num_workers": 1}}


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.parametrize("loss", ["sigmoid", "simpo", "orpo"])
def test_a_tiny_llama_learns_a_synthetic_preference(demo_dir, tmp_path, loss):
    cfg, _, spec = local_spec(_cfg(demo_dir, loss), tmp_path / "run")
    summary = run_in_process(spec)
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    first, last = records[0]["rewards/accuracies"], sum(r["rewards/accuracies"] for r in records[-5:]) / 5
    assert first < 0.75 and last > 0.9, (loss, first, last)
    assert records[-1]["rewards/margins"] > records[0]["rewards/margins"]
    assert summary["final"]["eval/rewards/accuracies"] > 0.9 and summary["final"]["eval/pairs"] == 60
    if loss == "sigmoid":  # the report: the reward plot and the eval rewards
        import yaml

        from scaletrain.report.markdown import write_report
        from scaletrain.rundir import RunDir

        RunDir(tmp_path / "run").resolved_config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        report = write_report(tmp_path / "run").read_text()
        assert "![rewards](rewards.png)" in report and "| eval/rewards/accuracies |" in report
        assert (tmp_path / "run" / "rewards.png").stat().st_size > 10_000


def _trainer(cfg_dict: dict, run_dir):
    from scaletrain.comm.context import DistContext
    from scaletrain.comm.watchdog import Heartbeat
    from scaletrain.worker.preference import objective_for
    from scaletrain.worker.trainer import build_trainer

    cfg, _, spec = local_spec(cfg_dict, run_dir)
    ctx = DistContext(world_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device="cpu",
                      backend="gloo")
    return build_trainer(ctx, spec, cfg, Heartbeat(spec.run_dir, 0, stall_s=60), objective_for(cfg))


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_lora_dpo_holds_no_second_copy_and_full_dpo_a_frozen_one(demo_dir, tmp_path):
    lora = _trainer(_cfg(demo_dir, "sigmoid"), tmp_path / "lora")
    assert lora.reference is None and _count(lora.model) == lora.facts.total  # the base, adapters off, is it
    full = _trainer(_cfg(demo_dir, "sigmoid", "full"), tmp_path / "full")
    assert _count(full.reference) == _count(full.model)
    assert not any(p.requires_grad for p in full.reference.parameters()) and not full.reference.training
    assert _trainer(_cfg(demo_dir, "simpo", "full"), tmp_path / "simpo").reference is None  # reference-free


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_resume_mid_run_is_bit_identical(demo_dir, tmp_path):
    cfg = _cfg(demo_dir, "sigmoid", "full", steps=8)
    cfg["checkpoint"] = {"save_steps": 4}
    resumes_bit_identical(cfg, tmp_path, 4)


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_reward_model_learns_the_preference_and_final_loads_as_a_scorer(demo_dir, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    from scaletrain.data import Collator, load_split
    from scaletrain.launch.job import finish_final

    cfg_dict = _cfg(demo_dir, "sigmoid", "full", steps=30)
    cfg_dict["train"].update(stage="rm", learning_rate=1e-3)
    cfg, tok, spec = local_spec(cfg_dict, tmp_path / "run")
    summary = run_in_process(spec)
    finish_final(cfg, tmp_path / "run", tok)
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert records[-1]["rewards/accuracies"] > 0.9 and "logps/chosen" not in records[-1]
    assert summary["final"]["eval/rewards/accuracies"] > 0.9 and summary["final"]["eval/loss"] < 0.3
    scorer = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "final").eval()
    assert scorer.config.num_labels == 1
    batch = Collator(spec.pad_token_id)([load_split(spec.eval_path)[i] for i in range(8)])
    with torch.no_grad():
        chosen, rejected = scorer(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.chunk(2)
    assert (chosen > rejected).float().mean() > 0.9  # the saved model scores as the run measured


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_precomputed_reference_trains_as_the_live_one_holds_none_and_resumes_bit_identical(demo_dir, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file

    cfg = _cfg(demo_dir, "sigmoid", "full", steps=6)
    cfg["checkpoint"] = {"save_steps": 3}
    _, _, live = local_spec(cfg, tmp_path / "live")
    run_in_process(live)
    cfg["train"]["precompute_ref_logps"] = True
    assert _trainer(cfg, tmp_path / "probe").reference is None  # no frozen copy while training
    _, _, pre = local_spec(cfg, tmp_path / "pre")
    run_in_process(pre)
    cached = list((tmp_path / "pre").parent.glob("runs/.cache/data/*/reference_logps-*.pt"))
    assert len(cached) == 1  # beside the tokenized data it was computed from
    assert train_losses(tmp_path / "pre") == pytest.approx(train_losses(tmp_path / "live"), rel=1e-5)
    _, _, again = local_spec(cfg, tmp_path / "again")  # killed after the step-3 checkpoint
    shutil.copytree(tmp_path / "pre" / "checkpoints" / "step-3", tmp_path / "again" / "checkpoints" / "step-3")
    run_in_process(again)  # reads the cached table: the initial model's numbers, not the resumed one's
    a = load_file(tmp_path / "pre" / "final" / "model.safetensors")
    b = load_file(tmp_path / "again" / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    cached[0].unlink()
    _, _, gone = local_spec(cfg, tmp_path / "gone")
    shutil.copytree(tmp_path / "pre" / "checkpoints" / "step-3", tmp_path / "gone" / "checkpoints" / "step-3")
    with pytest.raises(Exception, match="reference_logps-.*is gone; a resumed run needs"):
        run_in_process(gone)


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_kto_learns_from_tagged_replies(demo_dir, tmp_path):
    import json

    from scaletrain.data.demo import kto_rows

    data = tmp_path / "kto.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in kto_rows(400, seed=2)))
    cfg = _cfg(demo_dir, "sigmoid", steps=30)
    cfg["data"]["train_file"] = str(data)
    cfg["train"].update(stage="kto", logging_steps=5)
    _, _, spec = local_spec(cfg, tmp_path / "run")
    summary = run_in_process(spec)
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert records[-1]["rewards/margins"] > records[0]["rewards/margins"] + 0.5 and records[-1]["kl"] >= 0
    final = summary["final"]
    assert final["eval/rewards/chosen"] > 0 > final["eval/rewards/rejected"] and final["eval/pairs"] == 40

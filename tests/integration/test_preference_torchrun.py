"""Preference tuning, 1 and 2 workers under torchrun (what the worker loop does does not depend on the launcher, and
a torchrun job starts in ~18 s against ~30 s for a Ray one; these run beside the Ray tests under make test's two
pytest workers): 1 and 2 workers optimise the same mean over the global batch's pairs
(1e-5): LoRA DPO (DDP), full DPO under FSDP with its frozen reference sharded like the policy and with the
reference log-probabilities precomputed (2 ranks share the pass), and a reward model; and an imported
LLaMA-Factory DPO file trains on 2 workers."""

import json

import pytest
import yaml

from scaletrain.config import validate
from scaletrain.config.importers import from_llamafactory
from scaletrain.data.demo import preference_rows
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl
from scaletrain.scaling.parity import compare
from tests.conftest import train_losses

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # relative, CPU fp32


def _data(tmp_path):
    path = tmp_path / "pairs.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(128, seed=4)))
    return path


def _run(tmp_path, name, finetuning, strategy, workers, batch, accum, stage="dpo", precompute=False):
    cfg = validate({
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0,
                  "finetuning_type": finetuning},
        "data": {"train_file": str(_data(tmp_path)), "eval_ratio": 0.0, "max_length": 64, "template": "chatml"},
        "train": {"stage": stage, "strategy": strategy, "per_device_train_batch_size": batch,
                  "gradient_accumulation_steps": accum, "learning_rate": 2e-3, "max_steps": 4, "logging_steps": 1,
                  "seed": 3, "max_grad_norm": 0.0, "precompute_ref_logps": precompute},
        "scaling": {"num_workers": workers, "launcher": "torchrun"},
        "monitor": {"report": False},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": name},
    })
    return run_job(cfg, tmp_path / f"{name}.yaml", show_progress=False).run_dir


@pytest.mark.parametrize("stage,finetuning,strategy,precompute", [
    ("dpo", "lora", "ddp", False), ("dpo", "full", "fsdp", False), ("dpo", "full", "fsdp", True),
    ("rm", "full", "ddp", False)])
def test_one_and_two_workers_give_the_same_curve(tmp_path, stage, finetuning, strategy, precompute):
    kw = {"stage": stage, "precompute": precompute}
    one = _run(tmp_path, "1x4", finetuning, strategy, workers=1, batch=2, accum=4, **kw)  # 8 pairs a step
    two = _run(tmp_path, "2x2", finetuning, strategy, workers=2, batch=2, accum=2, **kw)
    reference = train_losses(one)
    assert len(reference) == 4 and reference[-1] < reference[0]
    result = compare(one, two)
    assert result["steps"] == 4 and result["max_rel_loss_diff"] < TOLERANCE, (result, train_losses(two))
    records = [r for r in read_jsonl(two / "metrics.jsonl") if r["kind"] == "train"]
    assert {"rewards/chosen", "rewards/accuracies", "rewards/margins"} <= set(records[-1])


def test_an_imported_llamafactory_dpo_file_trains_on_two_workers(tmp_path):
    from tests.unit.test_import import FIXTURES

    d = tmp_path / "data"
    d.mkdir()
    (d / "dpo_en_demo.json").write_text(json.dumps(preference_rows(64, seed=5)))
    (d / "dataset_info.json").write_text(json.dumps({"dpo_en_demo": {
        "file_name": "dpo_en_demo.json", "ranking": True,
        "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}}}))
    lf = yaml.safe_load((FIXTURES / "llama3_lora_dpo.yaml").read_text())
    lf.update(model_name_or_path="builtin:tiny-llama", dataset_dir=str(d), template="chatml", cutoff_len=64,
              max_steps=3, output_dir=str(tmp_path / "runs" / "dpo"), per_device_train_batch_size=2,
              gradient_accumulation_steps=2, bf16=False, ray_num_workers=2, val_size=0.125)
    cfg, _ = from_llamafactory(lf)
    cfg["scaling"]["launcher"] = "torchrun"
    run = run_job(validate(cfg), tmp_path / "dpo.yaml", show_progress=False).run_dir
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    assert summary["final"]["eval/pairs"] == 8 and "eval/rewards/accuracies" in summary["final"]

"""The training stages beyond SFT on 2 workers under Ray, for real (SFT's 2-worker Ray runs are test_train_ray.py's):
preference tuning (DPO), GRPO and a vision-language model each train on the shared Ray what the same job trains
under torchrun, step for step: the launcher starts the ranks and changes nothing they compute. Each stage's 1 = 2
workers parity is proven under torchrun (test_preference_torchrun.py, tests/loop/test_grpo_run.py,
tests/loop/test_vision_run.py), where a job starts faster."""

import json

import pytest

from scaletrain.data.demo import preference_rows
from scaletrain.metrics.records import read_jsonl
from tests.integration.test_rollout_ray import _cfg as rollout_cfg
from tests.integration.test_rollout_ray import write_sums
from tests.integration.train_checks import run

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def _dpo(tmp_path) -> dict:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(32, seed=4)))
    return {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0,
                      "finetuning_type": "lora"},
            "data": {"train_file": str(data), "eval_ratio": 0.0, "max_length": 64, "template": "chatml"},
            "train": {"stage": "dpo", "per_device_train_batch_size": 2, "learning_rate": 2e-3, "max_steps": 3}}


def _grpo(tmp_path) -> dict:
    cfg = rollout_cfg(write_sums(tmp_path), placement="colocated")  # the Ray rollout tests' GRPO job
    cfg.pop("scaling")
    return cfg


def _vision(tmp_path) -> dict:
    from tests.vlm import mllm_demo, save_tiny

    model = save_tiny("qwen2_vl", tmp_path / "qwen2-vl")
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "finetuning_type": "full",
                      "freeze_vision_tower": False, "freeze_multi_modal_projector": False},
            "data": {"dataset_dir": str(mllm_demo(tmp_path / "data", n=4)), "dataset": ["mllm_demo"],
                     "max_length": 96, "eval_ratio": 0},
            "train": {"per_device_train_batch_size": 1, "max_steps": 3, "learning_rate": 1e-3}}


def _train_records(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.parametrize("stage,config", [("dpo", _dpo), ("grpo", _grpo), ("vision", _vision)],
                         ids=["dpo", "grpo", "vision"])
def test_two_ray_workers_train_what_two_torchrun_workers_train(stage, config, tmp_path, no_orphans):
    cfg = config(tmp_path)
    cfg["train"].update(logging_steps=1, seed=3)
    cfg.update(scaling={"num_workers": 2}, monitor={"report": False})
    on_ray, on_torchrun = (run(cfg, tmp_path, f"{stage}-{launcher}", launcher=launcher).run_dir
                           for launcher in ("ray", "torchrun"))
    for run_dir, launcher in ((on_ray, "ray"), (on_torchrun, "torchrun")):
        assert f"on 2 worker(s), {launcher} (" in (run_dir / "logs" / "main.log").read_text()
    assert json.loads((on_ray / "summary.json").read_text())["world_size"] == 2
    ray_records, torchrun_records = _train_records(on_ray), _train_records(on_torchrun)
    assert [r["step"] for r in ray_records] == [r["step"] for r in torchrun_records] == [1, 2, 3]
    # (equal to the bit on this machine; the tolerance is parity's, for another machine's thread counts)
    assert [r["train/loss"] for r in ray_records] == pytest.approx([r["train/loss"] for r in torchrun_records],
                                                                   rel=1e-5, abs=1e-7)
    if stage == "grpo":  # the same completions on each rank: the same rewards
        assert [r["reward"] for r in ray_records] == pytest.approx([r["reward"] for r in torchrun_records],
                                                                   rel=1e-9)
    if stage == "dpo":
        assert [r["rewards/accuracies"] for r in ray_records] == [r["rewards/accuracies"] for r in torchrun_records]

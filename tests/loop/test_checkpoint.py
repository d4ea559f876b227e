"""Checkpoints: atomic + checksummed, corrupt newest falls back, and resume is bit-exact (in-process)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from scaletrain import checkpoint
from scaletrain.launch.local import run_in_process
from tests.conftest import local_spec


def _weights(run_dir):
    return load_file(run_dir / "final" / "model.safetensors")


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_corrupt_latest_falls_back_and_resume_is_bit_identical(classify_cfg, tmp_path):
    classify_cfg["train"].update(max_steps=12, logging_steps=4)
    classify_cfg["checkpoint"] = {"save_steps": 4, "save_total_limit": 3}
    _, _, ref = local_spec(classify_cfg, tmp_path / "ref")
    run_in_process(ref)
    ckpts = [p.name for p in checkpoint.list_checkpoints(tmp_path / "ref" / "checkpoints")]
    assert ckpts == ["step-4", "step-8", "step-12"]
    assert all(checkpoint.verify(tmp_path / "ref" / "checkpoints" / c) is None for c in ckpts)
    manifest = (tmp_path / "ref" / "checkpoints" / "step-4" / "manifest.json").read_text()
    for name in ("state/.metadata", "state/__0_0.distcp", "trainer_state.pt", "rng-rank0.pt"):
        assert f'"{name}"' in manifest  # DCP's shard and metadata, checksummed with the rest

    # A copy of the run as it was after step 8 crashed mid-way through writing step 12 ...
    _, _, spec = local_spec(classify_cfg, tmp_path / "b")
    shutil.copytree(tmp_path / "ref" / "checkpoints", tmp_path / "b" / "checkpoints")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-12")
    # ... and step-8 is corrupt on disk: one flipped byte.
    shard = tmp_path / "b" / "checkpoints" / "step-8" / "state" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "state/__0_0.distcp fails its checksum" in checkpoint.verify(shard.parent.parent)
    found, unusable = checkpoint.resume_point(tmp_path / "b" / "checkpoints")
    assert found.name == "step-4" and unusable == [("step-8", "state/__0_0.distcp fails its checksum")]

    run_in_process(spec)  # resumes from step-4 and runs steps 5..12 again
    main_log = (tmp_path / "b" / "logs" / "main.log").read_text()
    assert "resume: from step-4: step 4" in main_log
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_partial_checkpoint_is_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    (root / ".tmp-step-9").mkdir(parents=True)  # a crash before the rename
    (root / "step-5").mkdir()  # no manifest: not a finished checkpoint
    assert checkpoint.resume_point(root) == (None, [("step-5", "no manifest (partial write)")])
    assert checkpoint.verify(root / "step-5") == "no manifest (partial write)"


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.parametrize("data", [{"packing": True}, {"balance_ranks": True}])
def test_packed_and_balanced_runs_resume_bit_identical(demo_dir, tmp_path, data):
    cfg_dict = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
                "data": {"train_file": str(demo_dir / "chat.jsonl"), "formatting": "sharegpt", "eval_ratio": 0.1,
                         "max_length": 128, **data},
                "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 10,
                          "logging_steps": 2, "learning_rate": 1e-3},
                "checkpoint": {"save_steps": 4, "save_total_limit": 3}}
    _, _, ref = local_spec(cfg_dict, tmp_path / "ref")
    run_in_process(ref)
    _, _, spec = local_spec(cfg_dict, tmp_path / "b")  # killed after the step-4 checkpoint
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-4", tmp_path / "b" / "checkpoints" / "step-4")
    run_in_process(spec)
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "resume: from step-4" in (tmp_path / "b" / "logs" / "main.log").read_text()

"""Fitting big models on the shared local Ray, 2 CPU workers: sharded checkpoints resume on another world size,
async saves (the memory levers, the memory estimate and bf16 checkpoints: test_fit_torchrun.py; elastic resizing on
a simulated 2-node cluster: test_two_nodes.py)."""

import shutil

import pytest

from tests.conftest import train_losses
from tests.integration.fit_runs import _losses_by_step, _run

pytestmark = pytest.mark.ray


def _resume_cli(run_dir, *overrides):
    """`scaletrain train --resume RUN_DIR k=v ...`, in this process (the shared local Ray)."""
    import argparse

    from scaletrain.commands import train as train_command

    args = argparse.Namespace(config=None, overrides=list(overrides), resume=str(run_dir), force_resume=False,
                              no_progress=True)
    assert train_command.run(args) == 0


@pytest.fixture(scope="module")
def cut_fsdp_run(tmp_path_factory, ray_local):
    """An uninterrupted 2-worker FSDP run and the same run cut at step 7 (rank 1 dies after step-6 was saved),
    shared by the resumes below (each resumes its own copy). Both under torchrun (a job starts in about half a Ray
    one's time; what they save does not depend on the launcher): the resumes run on Ray."""
    import os

    from scaletrain.errors import TrainingError

    tmp_path = tmp_path_factory.mktemp("cut")
    common = dict(strategy="fsdp", steps=12, batch=2, gradient_accumulation_steps=2, save_steps=6, launcher="torchrun")
    reference = train_losses(_run(tmp_path, "ref", **common))
    os.environ["SCALETRAIN_FAULTS"] = "exit:1:7"
    try:
        with pytest.raises(TrainingError):
            _run(tmp_path, "cut", **common)
    finally:
        del os.environ["SCALETRAIN_FAULTS"]
    return tmp_path, reference


@pytest.mark.parametrize("workers", [1, 4])
def test_a_sharded_checkpoint_resumes_on_another_world_size_with_the_same_steps(cut_fsdp_run, tmp_path, no_orphans,
                                                                               workers):
    """Saved by 2 FSDP workers (each its own shard), resumed on 1 or 4: the global batch is kept (accumulation
    recomputed), the data position carried as steps, so the resumed steps train on the same samples as the
    uninterrupted 2-worker run: the same losses (parity tolerance), no sample repeated or skipped."""
    shared, reference = cut_fsdp_run
    run = tmp_path / "runs" / "cut"
    shutil.copytree(shared / "runs" / "cut", run)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")] == ["step-6"]
    assert sorted(p.name for p in (run / "checkpoints" / "step-6" / "state").glob("*.distcp")) == \
        ["__0_0.distcp", "__1_0.distcp"]  # a shard per rank
    # 4 workers on 2 cores: Ray's fractional CPUs (torchrun refuses more processes than cores); 1 under torchrun
    on = ["scaling.launcher=ray", "scaling.resources_per_worker={'CPU': 0.5}"] if workers == 4 else \
        ["scaling.launcher=torchrun"]
    _resume_cli(run, f"scaling.num_workers={workers}", *on)
    log = (run / "logs" / "main.log").read_text()
    assert "resume: from step-6: step 6" in log and f"{workers} worker(s)" in log
    by_step = _losses_by_step(run)
    ref_by_step = _losses_by_step(shared / "runs" / "ref")
    for step in range(7, 13):  # the resumed steps: the same samples, the same token mean
        assert by_step[step] == pytest.approx(ref_by_step[step], rel=1e-5), (step, by_step, ref_by_step)
    assert reference == [ref_by_step[s] for s in sorted(ref_by_step)]


def test_async_save_writes_the_same_checkpoints_and_resumes_exactly(tmp_path, ray_local, no_orphans):
    common = dict(strategy="fsdp", steps=8, save_steps=4)
    sync = _run(tmp_path, "sync", launcher="torchrun", **common)  # the reference: any launcher, the faster one
    run = _run(tmp_path, "async", async_save=True, tokenize_on="cluster", overwrite_cache=True, **common)
    # tokenized by Ray tasks (joined before the data is prepared), into the same data: the same losses below
    assert "Ray tasks on 1 node(s)" in (run / "logs" / "main.log").read_text()
    from scaletrain import checkpoint

    names = [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")]
    assert names == ["step-4", "step-8"] and all(checkpoint.verify(run / "checkpoints" / n) is None for n in names)
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())
    assert train_losses(run) == train_losses(sync)  # training did not change while the shards were written
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    for name, r in (("s", sync), ("a", run)):
        dcp_to_torch_save(str(r / "checkpoints" / "step-8" / "state"), str(tmp_path / f"{name}.pt"))
    import torch

    a, b = torch.load(tmp_path / "s.pt", weights_only=True), torch.load(tmp_path / "a.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])

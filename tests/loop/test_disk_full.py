"""A full disk, for real: a small tmpfs made by the test holds the run directory. A checkpoint that does not fit
leaves the previous one intact, removes its partial directory, and fails the run with one line naming the path
and the free space (or warns and goes on with checkpoint.on_write_error=warn); a resume after space is freed
finishes the run."""

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from scaletrain import checkpoint
from scaletrain.errors import StorageError
from scaletrain.launch.local import run_in_process
from tests.cli import run_cli
from tests.conftest import local_spec, train_losses


def _mount(path: Path, size_mb: float) -> str | None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size_mb * 1024)}k", "tmpfs", str(path)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def _resize(path: Path, size_mb: float) -> None:
    subprocess.run(["mount", "-o", f"remount,size={int(size_mb * 1024)}k", str(path)], check=True)


@pytest.fixture
def small_fs(tmp_path):
    mnt = Path("/tmp") / f"scaletrain-fs-{uuid.uuid4().hex[:8]}"
    why = _mount(mnt, 1)
    if why is not None:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here to fill ({why}); the disk-full test needs root or CAP_SYS_ADMIN")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: the in-process worker's log handler is open
    shutil.rmtree(mnt, ignore_errors=True)


def _sizes(classify_cfg, tmp_path) -> tuple[int, int]:
    """(one checkpoint's bytes, the run directory's bytes without checkpoints) of this job, measured."""
    _, _, spec = local_spec(classify_cfg, tmp_path / "probe")
    run_in_process(spec)
    ckpt = checkpoint.list_checkpoints(tmp_path / "probe" / "checkpoints")[-1]
    one = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    rest = sum(f.stat().st_size for f in (tmp_path / "probe").rglob("*")
               if f.is_file() and "checkpoints" not in f.parts)
    return one, rest


def _job(classify_cfg, **checkpoint_keys):
    cfg = {**classify_cfg, "checkpoint": {"save_steps": 4, "save_total_limit": 2, **checkpoint_keys}}
    cfg["train"] = {**cfg["train"], "max_steps": 12}
    return cfg


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_checkpoint_that_does_not_fit_keeps_the_previous_one_and_resume_after_freeing_space(
        small_fs, classify_cfg, tmp_path):
    cfg = _job(classify_cfg)
    one, rest = _sizes(cfg, tmp_path)
    _resize(small_fs, (rest + 1.5 * one) / 2**20 + 1)  # the first checkpoint fits, the second does not
    _, _, spec = local_spec(cfg, small_fs / "run")
    with pytest.raises(StorageError) as err:
        run_in_process(spec)
    message = str(err.value)
    assert "\n" not in message
    assert f"checkpoint step-8 could not be written to {small_fs / 'run' / 'checkpoints'}" in message
    assert "No space left on device" in message and "MiB free there" in message
    assert "the previous checkpoint is intact" in message and "--resume" in message
    root = small_fs / "run" / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["step-4"]  # no .tmp-step-8 left
    assert checkpoint.verify(root / "step-4") is None
    _resize(small_fs, (rest + 4 * one) / 2**20 + 4)  # space freed
    summary = run_in_process(spec)
    assert summary["steps"] == 12
    assert [r["step"] for r in _train_records(small_fs / "run")][-1] == 12
    assert checkpoint.verify(checkpoint.list_checkpoints(root)[-1]) is None


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_on_write_error_warn_goes_on_and_says_so(small_fs, classify_cfg, tmp_path):
    cfg = _job(classify_cfg, on_write_error="warn")
    one, rest = _sizes(cfg, tmp_path)
    _resize(small_fs, (rest + 1.5 * one) / 2**20 + 1)
    _, _, spec = local_spec(cfg, small_fs / "run")
    summary = run_in_process(spec)
    assert summary["steps"] == 12
    log = (small_fs / "run" / "logs" / "main.log").read_text()
    assert "checkpoint failed: checkpoint step-8 could not be written" in log
    assert "on_write_error=warn" in log
    root = small_fs / "run" / "checkpoints"
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())
    assert checkpoint.verify(root / "step-4") is None
    assert train_losses(small_fs / "run") == train_losses(tmp_path / "probe")  # training itself unchanged


def _train_records(run_dir: Path):
    from scaletrain.metrics.records import read_jsonl

    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.parametrize("on_error", ["fail", "warn"])
def test_an_io_error_midway_through_a_checkpoint_keeps_the_previous_one(classify_cfg, tmp_path, on_error):
    """Not a full disk: the device fails mid-write (SCALETRAIN_FAULTS' ioerror). The previous checkpoint stays
    usable, the partial one is gone, one line names the path and the error; the run stops or goes on as
    checkpoint.on_write_error says."""
    from dataclasses import replace

    from scaletrain.worker.faults import parse_faults

    _, _, spec = local_spec(_job(classify_cfg, on_write_error=on_error), tmp_path / "run")
    spec = replace(spec, faults=parse_faults("ioerror:0:8"))
    root = tmp_path / "run" / "checkpoints"
    if on_error == "fail":
        with pytest.raises(StorageError) as e:
            run_in_process(spec)
        message = str(e.value)
        assert "checkpoint step-8 could not be written to" in message and "Input/output error" in message
        assert "check the storage" in message and "free space" not in message and "\n" not in message
        assert [p.name for p in checkpoint.list_checkpoints(root)] == ["step-4"]
    else:
        run_in_process(spec)
        assert [p.name for p in checkpoint.list_checkpoints(root)] == ["step-4", "step-12"]
        assert "checkpoint failed" in (tmp_path / "run" / "logs" / "main.log").read_text()
    assert checkpoint.verify(root / "step-4") is None and not [p for p in root.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_a_disk_that_fills_under_the_local_launcher_is_one_line_not_a_logging_traceback(small_fs, classify_cfg,
                                                                                        tmp_path):
    """Through the CLI, in-process (the local launcher): the run directory's disk fills while training; the
    worker's log handler says so once, and the error names the real log file, never `worker-<rank>`."""
    import os

    from tests.conftest import write_config

    cfg = _job(classify_cfg)
    one, rest = _sizes(cfg, tmp_path)
    _resize(small_fs, (rest + 1.5 * one) / 2**20 + 1)
    cfg["output"] = {"output_dir": str(small_fs), "run_name": "cli"}
    cfg["data"] = {**cfg["data"], "cache_dir": str(tmp_path / "cache")}
    out = run_cli("train", write_config(tmp_path / "c.yaml", cfg), "scaling.launcher=local", "--no-progress",
                  env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode != 0
    assert "--- Logging error ---" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "<rank>" not in out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "checkpoint step-8 could not be written" in errors[0], out.stderr[-2000:]
    assert "MiB free there" in errors[0] and "CheckpointException" not in errors[0]

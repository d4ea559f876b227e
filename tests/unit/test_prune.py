"""`scaletrain prune` (#63): what old runs hold, freed as chosen, a dry run unless --yes, never a running run."""

import os
import time

import pytest

from scaletrain.after.prune import apply, choose, survey
from scaletrain.errors import ConfigError

DAY = 86400


def _run(root, name, *, finished=True, age_days=10.0, alive_pid=None):
    d = root / name
    for rel, size in (("config.resolved.yaml", 10), ("checkpoints/step-2/shard", 4000), ("data/train/x.arrow", 3000),
                      ("final/model.safetensors", 2000), ("logs/main.log", 100)):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(b"x" * size)
    if finished:
        (d / "summary.json").write_text("{}")
    if alive_pid:
        (d / "pids").mkdir()
        (d / "pids" / "rank-0.pid").write_text(str(alive_pid))
    old = time.time() - age_days * DAY
    for p in [*d.rglob("*"), d]:
        os.utime(p, (old, old))
    return d


@pytest.fixture
def runs(tmp_path):
    _run(tmp_path, "old-finished")
    _run(tmp_path, "old-stopped", finished=False)
    _run(tmp_path, "new", age_days=1)
    _run(tmp_path, "going", finished=False, alive_pid=os.getpid())  # this process: alive
    cache = tmp_path / ".cache" / "data" / "abc123"
    cache.mkdir(parents=True)
    (cache / "meta.json").write_bytes(b"x" * 500)
    old = time.time() - 10 * DAY
    os.utime(cache / "meta.json", (old, old))
    os.utime(cache, (old, old))
    return tmp_path


def test_a_dry_run_says_what_goes_and_deletes_nothing(runs):
    items = {i.path.name: i for i in choose(survey(runs), older_than_days=7, keep_final=False)}
    assert items["old-finished"].freed == 9112 and items["old-stopped"].freed == 9110  # (summary.json: 2 bytes)
    assert items["new"].freed == 0 and items["new"].why_kept == "newer than 7 days"
    assert items["going"].status == "running" and items["going"].freed == 0 and items["going"].why_kept == \
        "still going"
    assert items["abc123"].freed == 0 and "a run is going" in items["abc123"].why_kept
    assert (runs / "old-finished" / "checkpoints").exists()  # choosing deletes nothing


def test_keep_final_frees_checkpoints_and_data_and_never_a_running_run(runs):
    items = choose(survey(runs), older_than_days=7, keep_final=True)
    assert apply(items, keep_final=True) == 2 * 7000
    for name in ("old-finished", "old-stopped"):
        assert not (runs / name / "checkpoints").exists() and not (runs / name / "data").exists()
        assert (runs / name / "final" / "model.safetensors").exists() and (runs / name / "logs").exists()
    assert (runs / "going" / "checkpoints").exists() and (runs / "new" / "checkpoints").exists()


def test_whole_runs_go_without_keep_final(runs):
    (runs / "going" / "pids" / "rank-0.pid").write_text("999999999")  # it ended: its worker is gone
    items = choose(survey(runs), older_than_days=7, keep_final=False)
    apply(items, keep_final=False)
    assert not (runs / "old-finished").exists() and not (runs / "old-stopped").exists()
    assert (runs / "new").exists() and not (runs / ".cache" / "data" / "abc123").exists()


def test_bad_input_is_one_line(runs, tmp_path_factory):
    with pytest.raises(ConfigError, match="the run is still going .* prune never touches a running run"):
        survey(runs / "going")
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(ConfigError, match="holds no scaletrain run directory"):
        survey(empty)
    with pytest.raises(ConfigError, match="no such directory"):
        survey(empty / "nope")

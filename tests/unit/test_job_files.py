"""A submitted job finds its data (#60): every local file the config names is checked the way Ray packages the
working directory, before anything is uploaded; a file only a .gitignore leaves out is uploaded all the same, and
one nothing can bring is refused in one line naming it and the fix."""

from pathlib import Path

import pytest

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.launch.job_files import RayRules, plan_upload
from scaletrain.launch.submit import EXCLUDES


def _cfg(train_file: str, **data):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": train_file, **data}})


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "project"
    for rel in ("data/train.jsonl", "data/other.jsonl", "sub/deep/notes.jsonl", "sub/keep.txt", ".venv/x.py",
                "runs/old.jsonl", "config.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("{}\n")
    (root / ".gitignore").write_text("data/\n*.log\n")
    (root / "sub" / ".gitignore").write_text("*.jsonl\n")
    monkeypatch.chdir(root)
    return root


def _ray_uploads(root: Path, excludes: list[str], read_gitignore: bool) -> set[str]:
    """What Ray itself packages (its own traversal: the reference our simulation is held to)."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    seen = set()
    _dir_travel(root, [_get_excludes(root, [".git", ".venv", "venv", "__pycache__", *excludes])],
                lambda p: seen.add(p.relative_to(root).as_posix()) if p.is_file() else None,
                include_gitignore=read_gitignore)
    return seen


def test_the_simulation_leaves_out_what_ray_leaves_out(project):
    files = {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}
    ours = {f for f in files if not RayRules(project, [".git", ".venv", "venv", "__pycache__", *EXCLUDES]).left_out(f)}
    assert ours == _ray_uploads(project, EXCLUDES, read_gitignore=True) == {
        ".gitignore", "config.yaml", "sub/.gitignore", "sub/keep.txt"}


@pytest.mark.parametrize("named", ["data/train.jsonl", "sub/deep/notes.jsonl"])
def test_a_file_only_gitignore_leaves_out_is_uploaded_and_nothing_else_of_its_folder(project, named):
    upload = plan_upload(_cfg(named), project, EXCLUDES)
    assert not upload.read_gitignore and f"data.train_file={named}: ignored by .gitignore, uploaded" in upload.notes[0]
    uploaded = _ray_uploads(project, upload.excludes, read_gitignore=False)  # what Ray does with the plan
    assert named in uploaded
    assert uploaded - {named} == {".gitignore", "config.yaml", "sub/.gitignore", "sub/keep.txt"}


def test_a_file_ray_uploads_anyway_changes_nothing(project):
    upload = plan_upload(_cfg("config.yaml"), project, EXCLUDES)
    assert upload.read_gitignore and upload.excludes == EXCLUDES and upload.notes == []


@pytest.mark.parametrize("named,why", [
    ("runs/old.jsonl", "Ray would not upload it with the job (an exclude of scaletrain's or Ray's matches runs)"),
    ("../elsewhere.jsonl", "outside the working directory"),
])
def test_what_cannot_reach_the_job_is_refused_in_one_line(project, named, why):
    (project.parent / "elsewhere.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="data.train_file=") as e:
        plan_upload(_cfg(named), project, EXCLUDES)
    assert why in str(e.value) and "\n" not in str(e.value) and ("shared" in str(e.value) or "move" in str(e.value))


def test_a_rayignored_file_is_refused_and_one_too_large_too(project):
    (project / ".rayignore").write_text("data/train.jsonl\n")
    with pytest.raises(ConfigError, match=r"\(\.rayignore matches data/train.jsonl\)"):
        plan_upload(_cfg("data/train.jsonl"), project, EXCLUDES)
    with pytest.raises(ConfigError, match="over Ray's package limit of 0 MiB.*object storage"):
        plan_upload(_cfg("config.yaml"), project, EXCLUDES, limit=1)


def test_an_absolute_path_outside_is_read_on_the_cluster_and_said(project, tmp_path):
    shared = tmp_path / "shared.jsonl"
    shared.write_text("{}\n")
    upload = plan_upload(_cfg(str(shared)), project, EXCLUDES)
    assert upload.read_gitignore and "outside the working directory, not uploaded: the job reads it at that path" \
        in upload.notes[0]

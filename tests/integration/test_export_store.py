"""`scaletrain export s3://...`: a LoRA run whose directory is on object storage (the moto S3 server) exports to a
local directory with the same bytes as the export of the same run on disk; only config.resolved.yaml and final/
are fetched, into a staging folder that is gone after; -o is required and never overwritten."""

import json

import pytest

from tests.conftest import lora_run_dir, make_bucket


@pytest.fixture
def lora_run(tmp_path):
    _, run, _ = lora_run_dir(tmp_path, lora_std=0.1)
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "checkpoints" / "step-2" / "big.bin").write_bytes(b"x" * 1024)  # not fetched by export
    return run


def test_export_from_the_store_equals_the_local_export(lora_run, tmp_path, s3_server, capsys):
    import fsspec

    from scaletrain.cli import main

    bucket = make_bucket(s3_server, "exports")
    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    fs.put(str(lora_run) + "/", f"{bucket}/runs/r1/", recursive=True)
    uri = f"s3://{bucket}/runs/r1"

    assert main(["export", str(lora_run), "-o", str(tmp_path / "local")]) == 0
    assert main(["export", uri, "-o", str(tmp_path / "remote"), "--endpoint-url", s3_server]) == 0
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert sorted(p.name for p in remote.iterdir()) == sorted(p.name for p in local.iterdir())
    for p in local.iterdir():
        if p.suffix == ".safetensors":
            assert (remote / p.name).read_bytes() == p.read_bytes(), p.name
    assert json.loads((remote / "config.json").read_text()) == json.loads((local / "config.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "local", "remote", "run"]  # no staging left
    capsys.readouterr()

    assert main(["export", uri, "-o", str(tmp_path / "remote"), "--endpoint-url", s3_server]) != 0
    assert "exists; an export never overwrites" in capsys.readouterr().err
    assert main(["export", uri, "--endpoint-url", s3_server]) != 0
    assert "a run on object storage; give -o DIR" in capsys.readouterr().err
    assert main(["export", f"s3://{bucket}/runs/none", "-o", str(tmp_path / "x"), "--endpoint-url", s3_server]) != 0
    assert "no config.resolved.yaml there" in capsys.readouterr().err

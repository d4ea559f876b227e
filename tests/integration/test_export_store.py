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


def test_an_export_is_uploaded_to_a_new_place_on_the_store_never_over_one(lora_run, tmp_path, s3_server, capsys):
    import fsspec

    from scaletrain.cli import main

    bucket = make_bucket(s3_server, "uploads")
    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    uri = f"s3://{bucket}/models/m1"
    assert main(["export", str(lora_run), "-o", str(tmp_path / "out"), "--upload", uri,
                 "--endpoint-url", s3_server]) == 0
    assert f"uploaded {tmp_path / 'out'} to {uri}" in capsys.readouterr().err  # the console writes to stderr
    local = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert sorted(f.rsplit("/", 1)[-1] for f in fs.find(f"{bucket}/models/m1")) == local
    for name in local:
        assert fs.cat_file(f"{bucket}/models/m1/{name}") == (tmp_path / "out" / name).read_bytes(), name
    assert not [f for f in fs.find(bucket) if "write-probe" in f]  # the check's probe object is gone

    # the same place again: refused before any export is made (nothing written under -o either)
    assert main(["export", str(lora_run), "-o", str(tmp_path / "out2"), "--upload", uri,
                 "--endpoint-url", s3_server]) != 0
    assert f"--upload={uri}: exists; an upload never overwrites" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
    assert main(["export", str(lora_run), "-o", str(tmp_path / "out3"), "--upload", str(tmp_path / "x")]) != 0
    assert "not an object-storage URI" in capsys.readouterr().err and not (tmp_path / "out3").exists()
    assert main(["export", str(lora_run), "-o", str(tmp_path / "out4"), "--upload", "s3://no-such-bucket/m",
                 "--endpoint-url", s3_server]) != 0
    assert "--upload=s3://no-such-bucket" in capsys.readouterr().err and not (tmp_path / "out4").exists()

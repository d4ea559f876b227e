"""A run directory on object storage, against a real S3 API server on loopback (moto in server mode): checkpoints
committed by their manifest, rotation and a killed upload; the mirror and the relay; bad settings in seconds."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from scaletrain.checkpoint import Checkpointer, checkpoints_of, resume_point
from scaletrain.comm.context import DistContext
from scaletrain.config.schema import CheckpointConfig, StorageConfig
from scaletrain.errors import LaunchError
from scaletrain.rundir import RunDir
from scaletrain.storage import uri
from scaletrain.storage.mirror import Mirror, check_remote_output, create_remote_run, fetch_run
from scaletrain.storage.relay import Forwarder, Relay
from scaletrain.storage.uri import Store, probe
from tests.cli import run_cli
from tests.conftest import S3_SECRET, make_bucket, without_phases

# The integration tier: an S3 API server (moto) and CLI subprocesses, no Ray.

CTX = DistContext(0, 0, 1, 1, 0, "cpu", "gloo")


class Progress:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def _checkpointer(store: Store, keep: int = 2):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    progress = Progress()
    root, storage = checkpoints_of("unused", store)
    return Checkpointer(root, CTX, CheckpointConfig(save_total_limit=keep), model, optimizer, trainable_only=False,
                        states={"progress": progress}, storage=storage), model, optimizer, progress


def _train_step(model, optimizer, progress):
    model(torch.randn(3, 8)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    progress.step += 1


def test_checkpoints_on_the_store_exist_by_their_manifest_rotate_and_survive_a_killed_upload(s3_server):
    store = Store.of(f"s3://{make_bucket(s3_server, 'ckpt')}/runs/one", s3_server)
    fs = store.fs
    ckpt, model, optimizer, progress = _checkpointer(store)
    saved = {}
    for _ in range(3):
        _train_step(model, optimizer, progress)
        ckpt.save(progress.step, {"world_size": 1, "accumulation": 1})
        saved[progress.step] = {k: v.clone() for k, v in model.state_dict().items()}
    root = f"{store.path}/{RunDir.CHECKPOINTS}"
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root)) == ["step-2", "step-3"]  # keep 2: step-1 deleted
    # An upload killed midway: step-4's shards and states landed, its manifest never did.
    for f in fs.find(f"{root}/step-3"):
        if not f.endswith("manifest.json"):
            fs.copy(f, f.replace("/step-3/", "/step-4/"))
    fs.pipe_file(f"{root}/step-4/state/__9_0.distcp", b"half a shard")
    found, unusable = resume_point(*checkpoints_of("unused", store))
    assert found.name == "step-3" and unusable == [("step-4", "no manifest (partial write)")]
    # ...and one whose object changed after its manifest was written fails its checksum
    fs.pipe_file(f"{root}/step-3/trainer_state.pt", b"not the state")
    found, unusable = resume_point(*checkpoints_of("unused", store))
    assert found.name == "step-2" and unusable[-1] == ("step-3", "trainer_state.pt fails its checksum")

    again, model2, _, progress2 = _checkpointer(store)
    restored = again.restore_latest()
    assert restored.path.name == "step-2" and progress2.step == 2
    assert all(torch.equal(model2.state_dict()[k], saved[2][k]) for k in saved[2])
    # the next save of a step that has leftovers removes them first: only what this save wrote is there
    _train_step(model2, again.optimizer, progress2)
    _train_step(model2, again.optimizer, progress2)
    again.save(4, {"world_size": 1, "accumulation": 1})
    fs.invalidate_cache()
    assert not fs.exists(f"{root}/step-4/state/__9_0.distcp")
    assert resume_point(*checkpoints_of("unused", store))[0].name == "step-4"


def test_the_mirror_uploads_what_changed_and_keeps_machine_files_local(s3_server, tmp_path):
    store = Store.of(f"s3://{make_bucket(s3_server, 'mirror')}/runs", s3_server)
    cfg = StorageConfig(endpoint_url=s3_server, mirror_dir=str(tmp_path / "m"))
    check_remote_output(store.uri, "r1", cfg)
    local = create_remote_run(store.uri, "r1", "c.yaml", cfg)
    rd = RunDir(local)
    rd.resolved_config.write_text("model: {}\n")
    rd.metrics.write_text('{"kind": "train", "step": 1}\n')
    rd.private_env.write_text("{}")
    (rd.heartbeats / "rank-0.tmp").parent.mkdir()
    (rd.heartbeats / "rank-0.tmp").write_text("being written")
    mirror = Mirror(local, store.child("r1"), 30)
    assert mirror.sync() == 2 and mirror.sync() == 0  # the config and the metrics; nothing changed since
    with open(rd.metrics, "a") as f:
        f.write('{"kind": "train", "step": 2}\n')
    assert mirror.sync() == 1
    fs = store.fs
    fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.find(f"{store.path}/r1"))
    assert names == [RunDir.RESOLVED_CONFIG, RunDir.METRICS]  # no secrets file, no store.json, no partial file
    with pytest.raises(LaunchError, match="already exists .* never overwritten"):
        check_remote_output(store.uri, "r1", cfg)
    # another machine fetches it into its own mirror
    there = fetch_run(f"{store.uri}/r1", StorageConfig(endpoint_url=s3_server, mirror_dir=str(tmp_path / "b")))
    assert there != local and RunDir(there).metrics.read_text().count("\n") == 2
    # the remote run is removed; this machine's mirror of it is left: named, with how to remove it, kept
    fs.rm(f"{store.path}/r1", recursive=True)
    fs.invalidate_cache()
    with pytest.raises(LaunchError) as stale:
        create_remote_run(store.uri, "r1", "c.yaml", cfg)
    assert f"{store.uri}/r1 is not in the store, but a local mirror of a run of that name is left at {local}" \
        in str(stale.value) and f"(rm -r {local})" in str(stale.value)
    assert rd.metrics.is_file()  # nothing of it was touched


def test_the_relay_writes_what_workers_send_and_tells_them_to_stop(tmp_path):
    """Workers' files reach the driver's mirror through the relay: appended files as whole lines, others whole;
    a restarted worker does not send again what its predecessor sent; STOP travels back."""
    mirror, local = tmp_path / "mirror", tmp_path / "rank-0"
    mirror.mkdir()
    relay = Relay(str(mirror))
    m, w = RunDir(mirror), RunDir(local)
    w.logs.mkdir(parents=True)
    w.metrics.write_text('{"step": 1}\n{"step": 2')  # the second line is still being written
    w.summary.write_text("{}")
    restarted = Forwarder(local, relay.push)  # what an earlier process of this rank left here, it sent
    assert set(restarted.sent) == {RunDir.METRICS, RunDir.SUMMARY} and restarted.pending() == ([], {})
    fwd = Forwarder(local, relay.push)
    fwd.sent.clear()  # a first start: nothing sent yet
    fwd.send()
    assert m.metrics.read_text() == '{"step": 1}\n' and m.summary.read_text() == "{}"
    with open(w.metrics, "a") as f:
        f.write('}\n{"step": 3}\n')
    w.worker_log(0).write_text("line\n")
    fwd.send()
    assert m.metrics.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    assert m.worker_log(0).read_text() == "line\n"
    fwd.send()
    assert m.metrics.read_text().count("\n") == 3  # nothing new, nothing sent twice
    with open(w.metrics, "a") as f:
        f.write('{"step": 4}\n')

    def unreachable(items):
        raise ConnectionError("the driver is restarting")

    fwd.push = unreachable
    with pytest.raises(ConnectionError):
        fwd.send()
    fwd.push = relay.push  # the next round sends what the failed one could not
    fwd.send()
    assert m.metrics.read_text().endswith('{"step": 3}\n{"step": 4}\n')
    assert not w.stop.exists()
    m.stop.write_text("SIGTERM")
    fwd.send()
    assert w.stop.exists()
    assert relay.push([("../outside.txt", "w", b"x")]) and not (tmp_path / "outside.txt").exists()


def _fresh_filesystems():
    import s3fs

    uri.filesystem.cache_clear()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    _fresh_filesystems()
    yield
    _fresh_filesystems()


def _probe_error(uri_: str, endpoint: str | None) -> str:
    with pytest.raises(LaunchError) as e:
        probe(Store.of(uri_, endpoint))
    return str(e.value)


# In seconds: the client gives up after 4 attempts of a 5 s connect timeout (storage/uri.py S3_CLIENT, asserted as
# the values the store's client carries); a probe that retried for minutes is a hang, ended by the timeout mark.
@pytest.mark.timeout(120)
def test_bad_store_settings_fail_in_seconds_with_one_line(s3_server, tmp_path):
    make_bucket(s3_server, "probe")
    store = Store.of("s3://probe/runs", s3_server)
    probe(store)
    config = store.fs.s3.meta.config  # the client's own: botocore counts the first attempt in its total
    assert (config.connect_timeout, config.retries["total_max_attempts"]) == (5, 4)
    message = _probe_error("s3://probe/runs", "http://127.0.0.1:9")
    assert "nothing answers at http://127.0.0.1:9" in message and "storage.endpoint_url" in message
    message = _probe_error("s3://no-such-bucket/runs", s3_server)
    assert "the bucket no-such-bucket does not exist" in message
    assert "\n" not in message
    with pytest.raises(LaunchError, match="unknown storage scheme ftp://"):
        Store.of("ftp://host/runs")


@pytest.mark.timeout(120)
def test_missing_credentials_fail_in_seconds(s3_server, no_credentials):
    message = _probe_error("s3://probe/runs", s3_server)
    assert "no credentials found; export AWS_ACCESS_KEY_ID" in message


AUTH_SERVER = textwrap.dedent("""
    import json, os, sys, time
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "5"  # the set-up below runs unauthenticated, then IAM applies
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = "http://127.0.0.1:%d" % server._server.server_address[1]
    import boto3
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="locked")
    iam = boto3.client("iam", endpoint_url=endpoint)
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="read-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    print(json.dumps({"endpoint": endpoint, "id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}), flush=True)
    sys.stdin.read()
""")


def test_wrong_credentials_and_no_write_permission_are_told_apart(monkeypatch):
    """Against a server that checks credentials and IAM policies (moto with authentication on)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIASETUPSETUPSETUP1", AWS_SECRET_ACCESS_KEY="s" * 40,
               AWS_DEFAULT_REGION="us-east-1")
    server = subprocess.Popen([sys.executable, "-c", AUTH_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env, text=True)
    try:
        info = json.loads(server.stdout.readline())
        for key_id, secret, expected in (
                ("AKIAWRONGWRONGWRONG1", "w" * 40, "the credentials were refused"),
                (info["id"], info["secret"], "no permission to write there (Access Denied); grant s3:PutObject")):
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            _fresh_filesystems()
            message = _probe_error("s3://locked/runs", info["endpoint"])
            assert expected in message and secret not in message, message
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        _fresh_filesystems()


def test_train_on_a_dead_endpoint_is_one_line_before_anything_is_written(s3_server, tmp_path, demo_dir):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({
        "model": {"name_or_path": "builtin:tiny-bert", "num_labels": 2},
        "data": {"train_file": str(demo_dir / "sentiment.jsonl")},
        "output": {"output_dir": "s3://probe/runs", "run_name": "r"},
        "storage": {"endpoint_url": "http://127.0.0.1:9", "mirror_dir": str(tmp_path / "mirror")}}))
    out = run_cli("train", config, "--no-progress", cwd=tmp_path)
    lines = without_phases(out.stdout + out.stderr)  # "config checked" may come first: then the error alone
    assert out.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: output.output_dir=s3://probe/runs: nothing answers at http://127.0.0.1:9")
    assert not (tmp_path / "mirror").exists()  # no run directory, no data cache
    assert S3_SECRET not in out.stdout + out.stderr


def test_doctor_probes_the_store_and_checks_the_mirrors_disk(s3_server, tmp_path, demo_dir):
    from scaletrain.commands.doctor import gather_facts
    from scaletrain.config import validate
    from scaletrain.launch.doctor import Status, check_store

    make_bucket(s3_server, "doctor")

    def facts(endpoint):
        return gather_facts(validate({
            "model": {"name_or_path": "builtin:tiny-bert", "num_labels": 2},
            "data": {"train_file": str(demo_dir / "sentiment.jsonl")},
            "output": {"output_dir": "s3://doctor/runs"},
            "storage": {"endpoint_url": endpoint, "mirror_dir": str(tmp_path / "m")}}), smoke=False)

    good, bad = check_store(facts(s3_server)), check_store(facts("http://127.0.0.1:9"))
    assert good.status is Status.OK and "a probe object written and deleted" in good.detail
    assert bad.status is Status.FAIL and "nothing answers at http://127.0.0.1:9" in bad.detail


def test_watch_of_a_uri_shows_the_run_as_the_store_has_it(s3_server, tmp_path, monkeypatch, capsys):
    from scaletrain import cli

    fs = Store.of(f"s3://{make_bucket(s3_server, 'watch')}/runs", s3_server).fs
    fs.pipe_file(f"watch/runs/w/{RunDir.RESOLVED_CONFIG}", b"model: {}\n")
    fs.pipe_file(f"watch/runs/w/{RunDir.METRICS}", b'{"kind": "train", "step": 3, "loss": 0.5, "time": 1.0}\n')
    fs.pipe_file(f"watch/runs/w/{RunDir.MAIN_LOG}", b"2026-12-02 10:00:00 [rank 0] workers up: 2 x cpu\n")
    monkeypatch.setenv("HOME", str(tmp_path))  # the mirror goes to ~/.cache/scaletrain/mirror
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    assert cli.main(["watch", "s3://watch/runs/w", "--once"]) == 0
    out = capsys.readouterr().out
    assert "workers up: 2 x cpu" in out and "latest train rank 0: step 3: loss=0.5" in out
    assert (tmp_path / ".cache" / "scaletrain" / "mirror" / "s3" / "watch" / "runs" / "w" / RunDir.METRICS).is_file()


def test_a_last_upload_that_fails_is_said_not_raised_over_the_runs_outcome(s3_server, tmp_path):
    (tmp_path / RunDir.METRICS).write_text("{}\n")
    mirror = Mirror(tmp_path, Store.of("s3://gone/runs/r", "http://127.0.0.1:9"), 30)
    failed = mirror.close()
    assert failed is not None and "nothing answers at http://127.0.0.1:9" in failed

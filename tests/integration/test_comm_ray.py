"""commbench, its sweep, and doctor's smoke test on the shared local Ray (2 gloo workers)."""

import json

import pytest
import yaml

from scaletrain import cli
from scaletrain.comm.bench import COLLECTIVES, BenchParams
from scaletrain.launch.commbench import run_commbench

pytestmark = pytest.mark.ray


def test_every_collective_correct_with_nccl_tests_math(tmp_path, ray_local, no_orphans):
    params = BenchParams(COLLECTIVES, (4096, 1024**2), "float32", warmup_iters=1, iters=3)
    rows = run_commbench(params, 2, "gloo", None, {}, None, 60, tmp_path)
    assert [(r.collective, r.size) for r in rows] == [(c, s) for c in COLLECTIVES for s in (4096, 1024**2)]
    for r in rows:
        assert r.oop_wrong == 0 and r.ip_wrong == 0, r
        assert r.oop_time_us > 0 and r.count * 4 == r.size
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r.collective, 0.5)  # n = 2
        assert r.oop_busbw == pytest.approx(r.oop_algbw * factor)
        assert r.oop_algbw == pytest.approx(r.size / (r.oop_time_us * 1e-6) / 1e9)


def test_cli_json_and_sweep_write_a_profile(tmp_path, ray_local, capsys, no_orphans):
    out = tmp_path / "bench"
    code = cli.main(["commbench", "-n", "2", "-b", "1M", "-e", "2M", "--iters", "2", "-w", "1", "--json",
                     "--out", str(out), "--sweep", "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1,2"])
    assert code == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert [ln["settings"] for ln in lines] == [{"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                                                {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "2"}]
    best = yaml.safe_load((out / "best-profile.yaml").read_text())
    assert best["env"]["GLOO_SOCKET_IFNAME"] == "lo" and best["env"]["OMP_NUM_THREADS"] in ("1", "2")
    saved = json.loads((out / "commbench.json").read_text())
    assert len(saved) == 2 and all(r["oop_wrong"] == 0 for s in saved for r in s["rows"])


@pytest.mark.parametrize("argv,needle", [
    (["-n", "1"], "at least 2 workers"),
    (["-b", "1M", "-e", "1K"], "swap them"),
    (["-b", "lots"], "not a size"),
    (["-c", "allreduce"], "unknown collective"),
    (["--sweep", "NCCL_ALGO="], "value list is empty"),
])
def test_bad_input_is_one_line(argv, needle, capsys):
    assert cli.main(["commbench", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_doctor_smoke_all_reduce(classify_cfg, tmp_path, ray_local, capsys, monkeypatch, no_orphans):
    from scaletrain.console import console

    monkeypatch.setattr(console, "width", 300)  # one table row per line, whatever the terminal
    classify_cfg["scaling"]["num_workers"] = 2
    classify_cfg["train"]["lr_scaling"] = "linear"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(classify_cfg))
    assert cli.main(["doctor", str(path)]) == 0  # a warning does not fail the preflight
    rows = {ln.split("│")[1].strip(): ln for ln in capsys.readouterr().err.splitlines() if ln.count("│") == 5}
    assert "ok" in rows["all-reduce smoke test"] and "sum 3 (expected 3)" in rows["all-reduce smoke test"]
    # Two CPU workers on the shared 2-CPU Ray leave no core for Ray's own processes.
    assert "warn" in rows["CPU headroom"] and "take all 2 CPUs" in rows["CPU headroom"]
    classify_cfg["data"]["train_file"] = str(tmp_path / "missing.jsonl")
    path.write_text(yaml.safe_dump(classify_cfg))
    assert cli.main(["doctor", str(path), "--no-smoke"]) == 1

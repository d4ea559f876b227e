"""The goodput account of a run directory: every category from the driver's and rank 0's marks and the metric
records, restarts and the work they redid, several driver sessions."""

import json

import pytest

from scaletrain.metrics.goodput import account
from scaletrain.rundir import RunDir


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(tmp_path, marks, records):
    rd = RunDir(tmp_path)
    _write(rd.timeline, [{"event": e, "time": t} for e, t in marks])
    _write(rd.metrics, records)
    return account(tmp_path)


def _train(step, at, window=5, per=1.0):
    return {"kind": "train", "step": step, "time": at, "window_steps": window, "time/step_s": per}


def _one_restart():
    marks = [("launch", 0), ("prepared", 10), ("cluster", 15), ("worker_start", 20), ("model_ready", 23),
             ("worker_start", 45), ("model_ready", 47), ("train_end", 59), ("end", 65)]
    records = [_train(5, 30), {"kind": "checkpoint", "step": 5, "time": 31, "time/checkpoint_s": 2.0},
               _train(10, 37),  # lost: the group dies before its next checkpoint
               _train(10, 53),  # the restart resumed from step 5: steps 6-10 trained again
               _train(15, 58), {"kind": "eval", "step": 15, "time": 61, "time/final_eval_s": 3.0}]
    return marks, records


def test_a_run_with_one_restart_is_accounted_to_the_second(tmp_path):
    g = _run(tmp_path, *_one_restart())
    assert g["goodput/wall_s"] == 65 and g["goodput/interruptions"] == 1 and g["goodput/sessions"] == 1
    expected = {"data_prep": 10, "cluster_start": 5, "worker_start": 5, "model_load": 5, "restart": 8,
                "productive": 15, "lost_work": 5, "checkpoint": 2, "eval": 3, "finish": 3}
    assert {k: g[f"goodput/{k}_s"] for k in expected} == expected
    assert g["goodput/other_s"] == 65 - sum(expected.values())  # teardown, idle: what no category claims
    assert sum(g[f"goodput/{k}_s"] for k in (*expected, "other")) == pytest.approx(g["goodput/wall_s"], rel=0.01)
    assert g["goodput/ratio"] == pytest.approx(15 / 65) == g["goodput/ettr"]
    assert (g["restarts/detect_s"], g["restarts/worker_start_s"]) == (0, 8)  # no detection mark
    assert g["restarts/restore_s"] == 2  # the restart's model load (47 - 45), part of model_load_s
    marks, records = _one_restart()
    marks.insert(5, ("failure_detected", 40))  # the controller saw the failure 3 s after the last record (37)
    split = _run(tmp_path, marks, records)
    assert (split["restarts/detect_s"], split["restarts/worker_start_s"]) == (3, 5)
    assert split["goodput/restart_s"] == 8 and split["goodput/wall_s"] == 65  # the categories are unchanged


def test_a_stopped_and_resumed_run_has_one_account_over_its_sessions(tmp_path):
    first = [("launch", 0), ("prepared", 2), ("cluster", 3), ("worker_start", 4), ("model_ready", 5), ("end", 20)]
    second = [("launch", 100), ("prepared", 101), ("cluster", 102), ("worker_start", 103), ("model_ready", 106),
              ("end", 120)]
    records = [_train(5, 12, per=2.0), {"kind": "checkpoint", "step": 5, "time": 13, "time/checkpoint_s": 1.0},
               _train(10, 115, per=2.0)]
    g = _run(tmp_path, first + second, records)
    assert g["goodput/sessions"] == 2 and g["goodput/wall_s"] == 20 + 20 and g["goodput/interruptions"] == 0
    assert g["goodput/productive_s"] == 20 and g["goodput/model_load_s"] == 1 + 3
    unfinished = _run(tmp_path, first + second[:3], records)  # a driver killed mid-session: its time is unknown
    assert unfinished["goodput/sessions"] == 1 and unfinished["goodput/wall_s"] == 20


def test_chaos_kills_are_seeded_inside_the_run_and_refused_where_nothing_recovers():
    from scaletrain.config import validate
    from scaletrain.errors import ConfigError
    from scaletrain.worker.faults import chaos_faults

    kills = chaos_faults(3, 6.0, seed=1, target="worker", total_steps=24, world_size=2, ranks_per_node=2)
    assert kills == chaos_faults(3, 6.0, seed=1, target="worker", total_steps=24, world_size=2, ranks_per_node=2)
    steps = [f.step for f in kills]
    assert len(set(steps)) == 3 and all(2 <= s <= 24 for s in steps) and {f.kind for f in kills} == {"exit"}
    assert {f.rank for f in kills} <= {0, 1}
    assert kills != chaos_faults(3, 6.0, seed=2, target="worker", total_steps=24, world_size=2, ranks_per_node=2)
    node = chaos_faults(1, 6.0, seed=1, target="node", total_steps=24, world_size=4, ranks_per_node=2)
    assert len(node) == 2 and node[0].step == node[1].step and {node[0].rank, node[1].rank} in ({0, 1}, {2, 3})
    base = {"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x.jsonl"},
            "fault_tolerance": {"max_failures": 3, "chaos": {"kills": 3}}}
    with pytest.raises(ConfigError, match="without checkpoint.save_steps nothing can be recovered"):
        validate({**base, "checkpoint": {"save_steps": 0}})
    with pytest.raises(ConfigError, match="needs fault_tolerance.max_failures >= 3 \\(now 1\\)"):
        validate({**base, "checkpoint": {"save_steps": 4}, "fault_tolerance": {"max_failures": 1,
                                                                               "chaos": {"kills": 3}}})
    with pytest.raises(ConfigError, match="mtbf_steps"):
        validate({**base, "checkpoint": {"save_steps": 4},
                  "fault_tolerance": {"max_failures": 3, "chaos": {"kills": 3, "mtbf_steps": 0}}})


def test_a_running_session_is_counted_up_to_now_for_watch(tmp_path):
    from scaletrain.metrics.goodput import one_line

    marks, records = _one_restart()
    marks = [(e, t) for e, t in marks if t <= 47]  # still training, no end yet
    records = [r for r in records if r["time"] <= 53]
    rd = RunDir(tmp_path)
    _write(rd.timeline, [{"event": e, "time": t} for e, t in marks])
    _write(rd.metrics, records)
    assert account(tmp_path)["goodput/wall_s"] == 0  # a finished account knows no running session
    live = account(tmp_path, now=55)
    assert live["goodput/wall_s"] == 55 and live["goodput/interruptions"] == 1 and live["goodput/restart_s"] == 8
    line = one_line(live)
    assert line.startswith(f"goodput {live['goodput/ratio']:.0%} of 55 s: productive ")
    assert "data prep 10.0 s" in line and "restart 8.0 s" in line and line.endswith("1 interruption(s)")

"""Alert rules on crafted series, log scanning, the sampler, GPU readers with fakes, sinks, reports."""

import json
import socket
import sys
import types
import urllib.request

import pytest

from scaletrain.config.schema import AlertsConfig, MonitorConfig
from scaletrain.errors import ConfigError, LaunchError
from scaletrain.metrics.alerts import DataWait, LowGpuUtil, MemoryGrowth, Straggler, ThroughputDrop, build_rules
from scaletrain.metrics.gpu import AmdSmiReader, NvmlReader
from scaletrain.metrics.monitor import JsonlFollower, PrometheusSink, RunMonitor, check_sinks
from scaletrain.metrics.records import JsonlSink
from scaletrain.metrics.sampler import CpuShare, SystemSampler
from scaletrain.report.logscan import scan_logs


def train_rec(step, sps=100.0, ranks=(0.1, 0.1), wait=0.001, step_s=0.1):
    return {"kind": "train", "step": step, "throughput/samples_per_s": sps, "ranks/step_s": list(ranks),
            "time/data_wait_s": wait, "time/step_s": step_s}


def sys_rec(rank, util=None, rss=1.0):
    r = {"kind": "system", "rank": rank, "memory/rss_gib": rss, "system/cpu_pct": 50.0, "time": 0.0}
    if util is not None:
        r["gpu/util_pct"] = util
    return r


def feed(rule, records):
    return [a for r in records for a in rule.observe(r)]


def test_low_gpu_util_fires_after_k_intervals_once():
    rule = LowGpuUtil(20, 3)
    assert feed(rule, [sys_rec(1, 90)] * 10) == []
    alerts = feed(rule, [sys_rec(1, 5)] * 6)
    assert len(alerts) == 1 and alerts[0].rank == 1 and "below 20%" in alerts[0].message
    assert feed(LowGpuUtil(20, 3), [sys_rec(0)] * 5) == []  # CPU workers: no GPU field, no alert


def test_straggler_names_the_rank():
    rule = Straggler(1.5)
    assert feed(rule, [train_rec(s, ranks=(0.10, 0.11, 0.10)) for s in range(5)]) == []
    alerts = feed(rule, [train_rec(s, ranks=(0.1, 0.1, 0.4)) for s in range(6, 11)])
    assert len(alerts) == 1 and alerts[0].rank == 2 and alerts[0].step == 8  # the third late record in a row
    assert "rank 2 is a straggler" in alerts[0].message and "1.5x, 3 records in a row" in alerts[0].message


def test_a_rank_late_for_fewer_records_in_a_row_than_straggler_records_is_noise():
    """A late step or two (a collector pause, a host busy for a moment; at a run's first steps on a loaded machine
    a rank reached the sync 3x later than the other) is not a straggler: the rule waits for straggler_records."""
    blips = [train_rec(s, ranks=(0.4, 0.1) if s % 3 else (0.1, 0.1)) for s in range(1, 13)]  # late 2 in every 3
    assert feed(Straggler(1.5, records=3), blips) == []
    (alert,) = feed(Straggler(1.5, records=2), blips)
    assert alert.rank == 0 and alert.step == 2
    rules = build_rules(AlertsConfig(straggler_records=4))
    assert next(r for r in rules if isinstance(r, Straggler)).records == 4


def test_straggler_names_padding_imbalance_when_the_slow_rank_had_more_tokens():
    rule = Straggler(1.5, records=1)
    slow = {**train_rec(6, ranks=(0.1, 0.1, 0.4)), "ranks/tokens": [1000.0, 1100.0, 3900.0]}
    (alert,) = feed(rule, [slow])
    assert "cause: data, padding imbalance: it had 3.5x the median rank's tokens" in alert.message
    other = Straggler(1.5, records=1)
    (plain,) = feed(other, [{**train_rec(6, ranks=(0.1, 0.1, 0.4)), "ranks/tokens": [1000.0, 1000.0, 1000.0]}])
    assert "padding" not in plain.message  # equal tokens: the cause is elsewhere (a slow node, contention)


def test_a_straggler_is_named_with_its_node_the_others_wait_and_its_cause():
    def rec(**extra):
        return {**train_rec(6, ranks=(0.5, 0.5)), "time/step_s": 0.5, "ranks/ready_s": [0.1, 0.4],
                "ranks/node": ["n1", "n2"], "ranks/tokens": [100.0, 100.0], "ranks/data_wait_s": [0.0, 0.0],
                "ranks/cpu_pct": [180.0, 175.0], **extra}

    (device,) = feed(Straggler(1.5), [rec()] * 3)
    assert device.rank == 1 and "rank 1 on node n2 is a straggler: it reaches the gradient sync after 0.400 s" \
        in device.message
    assert "the other ranks wait 0.150 s of each 0.500 s step (30%)" in device.message  # (0.4 - median 0.25)
    assert "cause: device" in device.message
    (host,) = feed(Straggler(1.5), [rec(**{"ranks/cpu_pct": [180.0, 60.0]})] * 3)
    assert "cause: host, its process gets 50% of the median rank's CPU" in host.message
    (data,) = feed(Straggler(1.5), [rec(**{"ranks/data_wait_s": [0.0, 0.3]})] * 3)
    assert "cause: input, it waits 0.300 s a step for batches" in data.message


def test_throughput_drop():
    rule = ThroughputDrop(50)
    assert feed(rule, [train_rec(s, sps=100 + s % 3) for s in range(10)]) == []
    assert feed(rule, [train_rec(11, sps=30.0), train_rec(12, sps=31.0)]) == []  # two slow records: jitter
    alerts = feed(rule, [train_rec(13 + s, sps=30.0) for s in range(3)])  # five: a drop
    assert len(alerts) == 1 and "below 50%" in alerts[0].message


def test_a_value_hovering_at_the_threshold_alerts_once_and_a_resize_starts_a_new_baseline():
    rule = ThroughputDrop(50)
    steady = [train_rec(s, sps=100.0) for s in range(10)]
    jitter = [train_rec(10 + s, sps=20.0 if s % 3 == 0 else 100.0) for s in range(30)]  # a slow step in three
    assert feed(rule, steady + jitter) == []
    hovering = [train_rec(40 + s, sps=45.0 if (s // 3) % 2 else 55.0) for s in range(30)]  # at the threshold
    assert len(feed(rule, hovering)) == 1
    # clear for REARM records, then low again: a new episode, a new alert
    assert len(feed(rule, [train_rec(70 + s, sps=100.0) for s in range(8)] +
                    [train_rec(80 + s, sps=10.0) for s in range(5)])) == 1
    # elastic: 2 workers at 100 samples/s, then 1 worker at 40 (its normal speed): no alert; its own drop: one
    elastic = ThroughputDrop(50)
    two = [{**train_rec(s, sps=100.0), "scaling/workers": 2} for s in range(10)]
    one = [{**train_rec(10 + s, sps=40.0 + s % 2), "scaling/workers": 1} for s in range(10)]
    assert feed(elastic, two + one) == []
    assert len(feed(elastic, [{**train_rec(30 + s, sps=10.0), "scaling/workers": 1} for s in range(5)])) == 1
    wait = DataWait(30)
    flapping = [train_rec(s, wait=0.035 if (s // 3) % 2 else 0.025, step_s=0.1) for s in range(30)]
    assert len(feed(wait, flapping)) == 1
    slow = Straggler(1.5)
    # late for 3 records, on time for 2, over and over: one episode
    assert len(feed(slow, [train_rec(s, ranks=(0.1, 0.1, 0.16 if s % 5 < 3 else 0.14)) for s in range(20)])) == 1


def test_memory_growth_trend():
    rule = MemoryGrowth(25)
    assert feed(rule, [train_rec(1)] + [sys_rec(0, rss=1.0 + 0.01 * (i % 2)) for i in range(20)]) == []  # flat
    leak = feed(MemoryGrowth(25), [train_rec(1)] + [sys_rec(0, rss=1.0 + 0.1 * i) for i in range(10)])
    assert len(leak) == 1 and "leak trend" in leak[0].message
    # growth while the model loads, before the first logged step, is not a leak
    assert feed(MemoryGrowth(25), [sys_rec(0, rss=1.0 + 0.1 * i) for i in range(10)]) == []


def test_data_wait_share():
    rule = DataWait(30)
    assert feed(rule, [train_rec(s, wait=0.01, step_s=0.1) for s in range(5)]) == []
    assert feed(rule, [train_rec(6, wait=0.05, step_s=0.1)]) == []  # one slow batch: 18% of the window
    alerts = feed(rule, [train_rec(7 + s, wait=0.05, step_s=0.1) for s in range(3)])
    assert len(alerts) == 1 and "loader_workers" in alerts[0].message


def test_zero_disables_rules():
    rules = build_rules(AlertsConfig(gpu_util_min_pct=0, straggler_factor=0, throughput_drop_pct=0,
                                     memory_growth_pct=0, data_wait_pct=0))
    records = [train_rec(s, sps=1.0 if s > 5 else 100.0, ranks=(0.1, 9.0), wait=0.09) for s in range(10)]
    records += [sys_rec(0, util=0, rss=1 + i) for i in range(10)]
    assert all(feed(rule, records) == [] for rule in rules)


def test_log_scan_groups_across_ranks(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in (0, 1, 3):
        (logs / f"worker-{rank}.log").write_text(
            f"2026-01-01 10:00:0{rank},1 [rank {rank}] WARNING py.warnings: deprecated thing at step {rank * 7}\n"
            f"2026-01-01 10:00:0{rank},2 [rank {rank}] INFO scaletrain.worker: fine\n")
    (logs / "worker-3.log").write_text((logs / "worker-3.log").read_text() + "Traceback (most recent call last):\n"
                                       "  File \"x.py\", line 1, in <module>\nValueError: boom\n")
    findings = scan_logs(tmp_path)
    assert findings[0].line().startswith("[rank 0, 1, 3] (x3) WARNING: deprecated thing at step")
    assert any(f.level == "TRACEBACK" and f.ranks == {3} and "ValueError: boom" in f.message for f in findings)
    assert not any("fine" in f.message for f in findings)


def test_follower_keeps_partial_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    f = JsonlFollower(p)
    assert f.poll() == []
    p.write_text('{"a": 1}\n{"b"')
    assert f.poll() == [{"a": 1}]
    with open(p, "a") as fh:
        fh.write(': 2}\n')
    assert f.poll() == [{"b": 2}]


def test_sampler_values_are_plausible(tmp_path):
    import os
    import time

    sampler = SystemSampler(JsonlSink(tmp_path / "m.jsonl"), rank=3, device="cpu", interval_s=0.05).start()
    sum(i * i for i in range(300000))
    deadline = time.time() + 10  # three samples take 0.15 s; a loaded machine may starve the thread for longer
    while sampler.samples < 3 and time.time() < deadline:
        time.sleep(0.05)
    sampler.stop()
    recs = [json.loads(ln) for ln in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(recs) >= 3 and all(r["kind"] == "system" and r["rank"] == 3 for r in recs)
    for r in recs:
        assert 0 <= r["system/cpu_pct"] <= 100 * os.cpu_count() and r["memory/rss_gib"] > 0
        assert not any(k.startswith("gpu/") for k in r)  # CPU worker: absent, not zero


def test_a_records_cpu_share_is_its_own_windows_whatever_the_sampler_thread_reads(tmp_path):
    """The meter's CPU share (a straggler's host cause) once came from psutil's cpu_percent(None), whose window
    starts at the previous call by anyone: taken just after the sampler thread's, it read 0% for a busy rank
    and named the host as a slow device's cause (CI, stop 56)."""
    import time

    # the thread reads every 10 ms: often enough to race the meter's reads, cheap enough (~2% of a core) that an
    # idle window reads idle (every 1 ms it took 11% of a core itself, under make test)
    sampler = SystemSampler(JsonlSink(tmp_path / "m.jsonl"), rank=0, device="cpu", interval_s=0.01).start()
    share = CpuShare()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # busy, as a slow device's rank is
        pass
    busy = share.pct()
    share.start()
    time.sleep(0.3)
    idle = share.pct()
    sampler.stop()
    assert sampler.samples > 10  # the thread read psutil's share all along
    assert busy > 25 and idle < 15, (busy, idle)
    assert "system/cpu_pct" not in sampler.sample(cpu=False)  # the meter's reading leaves psutil's to the thread


def test_nvml_reader_with_fake():
    calls = {}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetHandleByPciBusId=lambda bus: calls.setdefault("bus", bus),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=40 * 2**30, total=80 * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 350000, nvmlDeviceGetTemperature=lambda h, kind: 61)
    out = NvmlReader(fake, "0000:1b:00.0").sample()
    assert calls["bus"] == "0000:1b:00.0"
    assert out == {"gpu/util_pct": 87.0, "gpu/memory_used_gib": 40.0, "gpu/memory_total_gib": 80.0,
                   "gpu/power_w": 350.0, "gpu/temp_c": 61.0}


def test_amdsmi_reader_with_fake_and_missing_metrics():
    def no_power(h):
        raise RuntimeError("not supported")

    fake = types.SimpleNamespace(
        amdsmi_init=lambda: None, amdsmi_get_processor_handle_from_bdf=lambda bdf: "h",
        AmdSmiMemoryType=types.SimpleNamespace(VRAM=0),
        AmdSmiTemperatureType=types.SimpleNamespace(HOTSPOT=1),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT=0),
        amdsmi_get_gpu_activity=lambda h: {"gfx_activity": 93, "umc_activity": 40, "mm_activity": 0},
        amdsmi_get_gpu_memory_usage=lambda h, t: 100 * 2**30, amdsmi_get_gpu_memory_total=lambda h, t: 192 * 2**30,
        amdsmi_get_power_info=no_power, amdsmi_get_temp_metric=lambda h, t, m: 70)
    out = AmdSmiReader(fake, "0000:05:00.0").sample()
    assert out == {"gpu/util_pct": 93.0, "gpu/memory_used_gib": 100.0, "gpu/memory_total_gib": 192.0,
                   "gpu/temp_c": 70.0}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_endpoint_scraped_over_loopback():
    port = _free_port()
    sink = PrometheusSink(port)
    try:
        sink.write({"kind": "train", "step": 3, "train/loss": 0.5, "throughput/samples_per_s": 12.0})
        sink.write({"kind": "system", "rank": 1, "memory/rss_gib": 1.5})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        sink.close()
    assert 'scaletrain_train_loss{rank="0"} 0.5' in text
    assert 'scaletrain_throughput_samples_per_s{rank="0"} 12.0' in text
    assert 'scaletrain_memory_rss_gib{rank="1"} 1.5' in text


def test_port_in_use_and_missing_packages(monkeypatch):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"monitor.prometheus_port={port} is in use"):
            check_sinks(MonitorConfig(prometheus_port=port))
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError, match="pip install prometheus-client"):
        check_sinks(MonitorConfig(prometheus_port=_free_port()))
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        check_sinks(MonitorConfig(report_to=["jsonl", "tensorboard"]))


def test_unknown_sink_name_is_a_config_error():
    from scaletrain.config import validate

    with pytest.raises(ConfigError, match=r"monitor.report_to.*'jsonl', 'tensorboard', 'wandb' or 'mlflow'"):
        validate({"model": {"name_or_path": "x"}, "data": {"train_file": "x"}, "monitor": {"report_to": ["comet"]}})


def test_monitor_feeds_alerts_and_tensorboard(tmp_path):
    records = [train_rec(s, ranks=(0.1, 0.5 if s > 3 else 0.1)) for s in range(1, 7)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    events = []
    mon = RunMonitor(tmp_path, MonitorConfig(report_to=["jsonl", "tensorboard"]), events=lambda *a: events.append(a))
    with mon:
        pass
    alerts = [json.loads(ln) for ln in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [a["rule"] for a in alerts] == ["straggler"] and alerts[0]["rank"] == 1
    assert events and events[0][0] == "alert"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_report_needs_a_run_dir_and_a_writable_place(tmp_path):
    from scaletrain.report.markdown import write_report

    with pytest.raises(ConfigError, match="not a scaletrain run directory"):
        write_report(tmp_path)
    (tmp_path / "config.resolved.yaml").write_text(
        "model: {name_or_path: x, task: causal-lm, finetuning_type: full}\n"
        "train: {strategy: ddp, per_device_train_batch_size: 2, gradient_accumulation_steps: 1}\n"
        "scaling: {num_workers: 1}\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="report directory .* is not writable; pass --out DIR"):
        write_report(tmp_path, blocker / "sub")
    path = write_report(tmp_path)  # a run with no records yet still gets a report
    assert "Status: **running or stopped**" in path.read_text()


def test_report_out_never_replaces_another_runs_files(tmp_path):
    from scaletrain.report.markdown import write_report

    def make_run(name):
        run = tmp_path / name
        run.mkdir()
        (run / "config.resolved.yaml").write_text(
            "model: {name_or_path: x, task: causal-lm, finetuning_type: full}\n"
            "train: {strategy: ddp, per_device_train_batch_size: 2, gradient_accumulation_steps: 1}\n"
            "scaling: {num_workers: 1}\n")
        return run

    a, b = make_run("run-a"), make_run("run-b")
    b_report = write_report(b).read_text()
    with pytest.raises(ConfigError, match=r"--out .*run-b is another run's directory"):
        write_report(a, b)
    assert (b / "report.md").read_text() == b_report
    user = tmp_path / "mine"
    user.mkdir()
    (user / "loss.png").write_bytes(b"the user's own plot")
    with pytest.raises(ConfigError, match=r"already holds loss.png not written for run-a"):
        write_report(a, user)
    assert (user / "loss.png").read_bytes() == b"the user's own plot"
    shared = tmp_path / "reports"
    first = write_report(a, shared)  # a new directory, then a refresh of the same run's report there: allowed
    assert write_report(a, shared) == first and first.read_text().startswith("# scaletrain report: run-a\n")
    with pytest.raises(ConfigError, match=r"already holds report.md not written for run-b"):
        write_report(b, shared)


def test_preference_alerts_name_a_stuck_accuracy_and_a_runaway_margin():
    from scaletrain.metrics.alerts import PreferenceHealth

    rule = PreferenceHealth(stuck=3, margin_max=20.0)
    fired = []
    for step, (acc, margin) in enumerate([(0.5, 0.0), (0.52, 0.1), (0.49, 0.1), (0.5, 0.1), (0.9, 3.0),
                                          (1.0, 25.0), (1.0, 30.0)], 1):
        fired += [(step, a.message) for a in rule.observe({"kind": "train", "step": step,
                                                          "rewards/accuracies": acc, "rewards/margins": margin})]
    assert [s for s, _ in fired] == [3, 6]  # once when stuck for 3 records, once when the margin runs away
    assert "at chance (0.49) for 3 records" in fired[0][1] and "beyond 20" in fired[1][1]
    assert PreferenceHealth(0, 0).observe({"kind": "train", "rewards/accuracies": 0.5, "rewards/margins": 99}) == []


def _nvml(uncorrected: list[int], pending: int = 0, rows=(0, 0, 0, 0)):
    """A pynvml double answering as nvidia-ml-py does (ints, lists of addresses, the remapped-rows tuple); the
    uncorrectable count takes the next value of ``uncorrected`` at each read."""
    counts = iter(uncorrected)
    consts = {"NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0, "NVML_VOLATILE_ECC": 0,
              "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
              "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1}
    return types.SimpleNamespace(
        **consts, nvmlInit=lambda: None, nvmlDeviceGetHandleByPciBusId=lambda bus: "h",
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: next(counts) if kind == 1 else 12,
        nvmlDeviceGetRetiredPages=lambda h, cause: [0x1000] if cause == 1 else [],
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: pending, nvmlDeviceGetRemappedRows=lambda h: rows)


def test_gpu_health_names_a_likely_hardware_fault_when_uncorrectable_errors_rise():
    from scaletrain.metrics.gpu import hardware_fault

    reader = NvmlReader(_nvml([0, 2]), "0000:1b:00.0")
    before, after = reader.health(), reader.health()
    assert before == {"bus_id": "0000:1b:00.0", "ecc_uncorrected": 0, "ecc_corrected": 12, "retired_pages": 1,
                      "retirement_pending": False}
    assert hardware_fault(before, after) == "uncorrectable ECC errors rose by 2 (to 2)"
    steady = NvmlReader(_nvml([3, 3]), "0000:1b:00.0")
    assert hardware_fault(steady.health(), steady.health()) is None  # old errors: not this failure's cause
    pending = NvmlReader(_nvml([0, 0], rows=(0, 1, 1, 0)), "0000:1b:00.0")
    assert "retirement is pending" in hardware_fault(pending.health(), pending.health())
    amd = types.SimpleNamespace(
        amdsmi_init=lambda: None, amdsmi_get_processor_handle_from_bdf=lambda bus: "h",
        amdsmi_get_gpu_total_ecc_count=lambda h: {"correctable_count": 5, "uncorrectable_count": 1,
                                                  "deferred_count": 0},
        amdsmi_get_gpu_bad_page_info=lambda h: [{"value": 0, "page_address": 4096, "page_size": 4096,
                                                 "status": "RESERVED"},
                                                {"value": 1, "page_address": 8192, "page_size": 4096,
                                                 "status": "PENDING"}])
    health = AmdSmiReader(amd, "0000:05:00.0").health()
    assert health == {"bus_id": "0000:05:00.0", "ecc_uncorrected": 1, "ecc_corrected": 5, "retired_pages": 1,
                      "retirement_pending": True}
    broken = types.SimpleNamespace(amdsmi_init=lambda: None, amdsmi_get_processor_handle_from_bdf=lambda bus: "h")
    assert AmdSmiReader(broken, "0000:05:00.0").health() == {"bus_id": "0000:05:00.0"}  # nothing known, no crash
    assert hardware_fault(None, None) is None


def test_a_failure_line_carries_the_hardware_note(caplog):
    import logging

    from scaletrain.metrics.logs import WORKER_LOGGER, log_failure, parse_failure

    with caplog.at_level(logging.ERROR, logger=WORKER_LOGGER):
        log_failure(1, 7, "forward", RuntimeError("CUDA error: an illegal memory access"),
                    "likely hardware fault: GPU 0000:1b:00.0 on n2: uncorrectable ECC errors rose by 2 (to 2)")
    line = f"[rank 1] ERROR {WORKER_LOGGER}: {caplog.records[-1].getMessage()}"
    rank, what = parse_failure(line)
    assert rank == 1 and what.startswith("RuntimeError: CUDA error: an illegal memory access [likely hardware fault")


def test_a_faulty_nodes_restart_leaves_it_out(tmp_path):
    """A worker's likely hardware fault marks its Ray node in the exception's notes (as worker/loop.py does);
    Ray Train's controller, on restarting after that failure, gets a label selector without the node, which Ray's
    own validator accepts. A failure that is not the GPU's excludes nothing."""
    import traceback

    from ray._private.label_utils import validate_label_selector

    from scaletrain.launch.ray_callbacks import NodeExclusion
    from scaletrain.metrics.gpu import faulty_node_note
    from scaletrain.worker.faults import InjectedGpuFault

    bad, other = "a1" * 28, "b2" * 28  # Ray node ids: 56 hex digits
    gpu_error = InjectedGpuFault("injected GPU fault at step 3 on rank 1")
    gpu_error.add_note(faulty_node_note("likely hardware fault: GPU cpu on host: " + gpu_error.hardware_fault, bad))
    as_ray_sends_it = "".join(traceback.format_exception(gpu_error))  # the traceback text the controller gets

    class Failed:  # Ray Train's RestartingState: the error with each rank's failure
        def __init__(self, failures):
            self.training_failed_error = types.SimpleNamespace(worker_failures=failures)

    exclusion = NodeExclusion(run_dir=str(tmp_path))
    assert exclusion.on_controller_start_worker_group(scaling_config=None, num_workers=2) is None
    exclusion.after_controller_state_update(None, Failed({0: "RuntimeError: a plain bug [no node]"}))
    assert exclusion.on_controller_start_worker_group(scaling_config=None, num_workers=2) is None
    exclusion.after_controller_state_update(None, Failed({1: as_ray_sends_it}))
    exclusion.after_controller_state_update(None, Failed({1: as_ray_sends_it}))  # said once
    selector = exclusion.on_controller_start_worker_group(scaling_config=None, num_workers=1)
    assert selector == {"ray.io/node-id": f"!in({bad})"} and validate_label_selector(selector) is None
    exclusion.after_controller_state_update(None, Failed({0: faulty_node_note("likely hardware fault", other)}))
    assert exclusion.on_controller_start_worker_group(scaling_config=None, num_workers=1) == {
        "ray.io/node-id": f"!in({bad},{other})"}
    log = (tmp_path / "logs" / "main.log").read_text()
    assert log.count("exclude: node a1a1a1a1a1a1 (a likely hardware fault on rank 1's GPU)") == 1


def test_a_worker_log_on_a_full_disk_is_one_warning_not_a_traceback_per_line(tmp_path, capfd):
    """/dev/full fails every write with ENOSPC, as a full disk does: logging's own handler would print
    '--- Logging error ---' and a traceback for each record."""
    import logging

    from scaletrain.metrics.logs import WorkerLogHandler

    handler = WorkerLogHandler("/dev/full")
    log = logging.getLogger("scaletrain.test.full")
    log.addHandler(handler)
    try:
        for i in range(3):
            log.warning("line %d", i)
    finally:
        log.removeHandler(handler)
        handler.close()
    err = capfd.readouterr().err
    assert err.count("warning: /dev/full cannot be written (No space left on device)") == 1
    assert "Logging error" not in err and "Traceback" not in err


def test_the_system_sampler_on_a_full_disk_says_so_once_and_raises_in_no_thread(capfd):
    import threading
    import time

    from scaletrain.metrics.sampler import SystemSampler

    class FullDisk:
        def write(self, record):
            raise OSError(28, "No space left on device")

    raised = []
    hook, threading.excepthook = threading.excepthook, lambda args: raised.append(args.exc_value)
    try:
        sampler = SystemSampler(FullDisk(), rank=3, device="cpu", interval_s=0.01)
        sampler.start()
        time.sleep(0.2)
        sampler.stop()
    finally:
        threading.excepthook = hook
    err = capfd.readouterr().err
    assert raised == [] and sampler.unwritable
    assert err.count("warning: system metrics of rank 3 cannot be written (No space left on device)") == 1

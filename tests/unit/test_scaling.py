"""MFU, the prediction model against hand-computed ring times, scale table assembly and parity verdicts."""

import json

import pytest

from scaletrain.metrics.flops import device_key, flops_per_token, mfu, peak_tflops
from scaletrain.scaling.parity import compare, verdict
from scaletrain.scaling.predict import BusCurve, Inputs, allgather_s, allreduce_s, step, table
from scaletrain.scaling.profiles import PROFILES, missing, profile_for
from scaletrain.scaling.sweep import add_speedup, write_outputs
from tests.conftest import reference_file


def test_flops_per_token_by_hand():
    # 1e9 non-embedding params, 24 layers, d=2048, S=1024: 6e9 + 12*24*2048*1024
    assert flops_per_token(10**9, 24, 2048, 1024) == 6e9 + 603979776
    # LoRA: 4N + 6 N_lora + attention
    assert flops_per_token(10**9, 24, 2048, 1024, lora_params=10**7) == 4e9 + 6e7 + 603979776


def test_mfu_by_hand_and_device_names():
    # 3000 tokens/s x 6.6e9 FLOPs/token on an MI300X bf16 (1307.4 TFLOP/s) = 1.98e13 / 1.3074e15
    assert mfu(3000, 6.6e9, peak_tflops("AMD Instinct MI300X", "bf16")) == pytest.approx(0.015144, rel=1e-4)
    assert device_key("NVIDIA H100 80GB HBM3") == "H100-SXM" and device_key("NVIDIA H100 PCIe") == "H100-PCIE"
    assert device_key("AMD Instinct MI250X/MI250") == "MI250X-GCD" and device_key("NVIDIA A100-SXM4-80GB") == "A100"
    assert peak_tflops("AMD Instinct MI355X", "bf16") == 2500.0 and peak_tflops("NVIDIA B200", "fp8") == 4500.0


def test_unknown_device_or_dtype_is_na_with_a_warning():
    with pytest.warns(UserWarning, match="MFU is n/a"):
        assert peak_tflops("Some Future GPU", "bf16") is None
    with pytest.warns(UserWarning):
        assert peak_tflops("AMD Instinct MI210", "bf16") is None  # not published: never guessed
    assert mfu(1000, 1e9, None) is None


def test_ring_allreduce_time_by_hand():
    flat = BusCurve(((1, 100.0),))  # 100 GB/s at every size
    # 100 MB over 4 ranks: 1e8 * 2*3/4 / 1e11 = 1.5 ms; all-gather of the same buffer: 1e8 * 3/4 / 1e11
    assert allreduce_s(1e8, 4, flat) == pytest.approx(1.5e-3)
    assert allgather_s(1e8, 4, flat) == pytest.approx(0.75e-3)
    assert allreduce_s(1e8, 1, flat) == 0.0
    curve = BusCurve(((1 << 20, 10.0), (4 << 20, 30.0)))
    assert curve.busbw(2 << 20) == pytest.approx(20.0)  # log-size midpoint
    assert curve.busbw(1) == 10.0 and curve.busbw(1 << 30) == 30.0


def test_ddp_prediction_buckets_and_overlap():
    flat = BusCurve(((1, 10.0),))
    inp = Inputs(compute_s=0.3, grad_bytes=100e6, intra=flat, bucket_bytes=25e6, overlap=0.0)
    r = step(inp, 2)  # 4 buckets of 25 MB: each 25e6 * 1 / 1e10 = 2.5 ms
    assert r["comm_s"] == pytest.approx(0.01) and r["exposed_comm_s"] == pytest.approx(0.01)
    hidden = step(Inputs(0.3, 100e6, flat, bucket_bytes=25e6, overlap=1.0), 2)
    assert hidden["exposed_comm_s"] == pytest.approx(0.0025)  # only the last bucket is exposed
    rows = table(Inputs(0.3, 100e6, flat, bucket_bytes=25e6, overlap=0.0, samples_per_step_per_device=8), [1, 2])
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] == pytest.approx(2 * 0.3 / 0.31)
    assert rows[1]["samples_per_s"] == pytest.approx(16 / 0.31)


def test_fsdp_prediction_moves_params_twice_and_grads_once():
    flat = BusCurve(((1, 10.0),))
    r = step(Inputs(1.0, 40e6, flat, strategy="fsdp", param_bytes=40e6, overlap=0.0), 4)
    assert r["comm_s"] == pytest.approx(3 * 40e6 * 0.75 / 1e10)


def test_seed_setup_cannot_lose_19_percent_to_gradient_sync():
    # Llama-3-8B LoRA (r=16 on all linear layers ~ 42M params, bf16 grads ~ 84 MB), MI300X XGMI: even with no
    # overlap at all, the all-reduce is ~1 ms against a multi-second step, so efficiency stays > 99%.
    inp = Inputs(compute_s=2.0, grad_bytes=84e6, intra=PROFILES["mi300x"]["intra"], overlap=0.0)
    eff = {r["workers"]: r["efficiency"] for r in table(inp, [2, 4, 8])}
    assert all(e > 0.99 for e in eff.values())


def test_scale_table_files(tmp_path):
    rows = add_speedup([{"workers": 1, "samples_per_s": 10.0, "note": ""},
                        {"workers": 2, "samples_per_s": 18.0, "note": ""},
                        {"workers": 8, "note": "skipped: the cluster fits 2 workers"}])
    assert rows[1]["speedup"] == pytest.approx(1.8) and rows[1]["efficiency"] == pytest.approx(0.9)
    paths = write_outputs(rows, tmp_path, "t")
    assert [p.name for p in paths] == ["scaling.md", "scaling.csv", "scaling.json", "scaling.png"]
    header = (tmp_path / "scaling.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["workers", "samples_per_s", "tokens_per_s", "speedup", "efficiency"]
    assert "skipped" in (tmp_path / "scaling.md").read_text()


def _run(tmp_path, name, losses, eval_loss):
    d = tmp_path / name
    d.mkdir()
    recs = [{"kind": "train", "step": i + 1, "train/loss": v} for i, v in enumerate(losses)]
    recs.append({"kind": "eval", "step": len(losses), "eval/loss": eval_loss})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def test_parity_compare_and_verdict(tmp_path):
    a = _run(tmp_path, "a", [1.0, 0.9, 0.8], 0.7)
    b = _run(tmp_path, "b", [1.0, 0.9000001, 0.8000002], 0.7000001)
    c = _run(tmp_path, "c", [1.0, 0.8, 0.6], 0.5)
    good, bad = compare(a, b), compare(a, c)
    assert verdict(good, 1e-3) and good["steps"] == 3
    assert not verdict(bad, 1e-3) and bad["worst_step"] == 3 and bad["max_rel_loss_diff"] == pytest.approx(0.25)


def test_a_full_mesh_node_gives_fewer_gpus_fewer_links():
    from scaletrain.scaling.predict import link_factor

    flat = BusCurve(((1, 313.0),))  # measured with all 8 GPUs of the node
    assert link_factor("full-mesh", 2, 8) == pytest.approx(1 / 7) and link_factor("full-mesh", 8, 8) == 1.0
    assert link_factor("switch", 2, 8) == 1.0
    mesh = Inputs(1.0, 1e9, flat, overlap=0.0, bucket_bytes=1e9, topology="full-mesh")
    switch = Inputs(1.0, 1e9, flat, overlap=0.0, bucket_bytes=1e9, topology="switch")
    # 2 GPUs: one xGMI link, 313/7 ~ 44.7 GB/s: 1e9 * 2*1/2 / 44.7e9
    assert step(mesh, 2)["comm_s"] == pytest.approx(1e9 / (313e9 / 7))
    assert step(switch, 2)["comm_s"] == pytest.approx(1e9 / 313e9)
    assert step(mesh, 8)["comm_s"] == pytest.approx(step(switch, 8)["comm_s"])
    assert PROFILES["mi300x"]["topology"] == "full-mesh"


def test_zero3_gathers_parameters_in_every_micro_batch():
    flat = BusCurve(((1, 10.0),))
    one = step(Inputs(1.0, 40e6, flat, strategy="fsdp", param_bytes=40e6, overlap=0.0, n_layers=4), 4)
    four = step(Inputs(1.0, 40e6, flat, strategy="fsdp", param_bytes=40e6, overlap=0.0, n_layers=4,
                       micro_batches=4), 4)
    gather = 40e6 * 0.75 / 1e10
    assert one["comm_s"] == pytest.approx(3 * gather)
    assert four["comm_s"] == pytest.approx(2 * 4 * gather + gather)  # gathers per micro-batch, one reduce


@pytest.mark.parametrize("profile,side,name", [
    ("mi300x", "intra", "rccl-tests-all_reduce_perf-8xMI300X.txt"),
    ("mi300x", "inter", "rccl-tests-all_reduce_perf-2node-16xMI300X.txt"),
    ("h100-sxm", "inter", "nccl-tests-all_reduce_perf-2node-16xH100.txt"),
    ("pcie", "intra", "nccl-tests-all_reduce_perf-2xRTX2080Ti.txt"),
])
def test_measured_profile_curves_are_the_reference_outputs_rows(profile, side, name):
    from scaletrain.comm.bench import parse_nccl_tests

    parsed = parse_nccl_tests(reference_file(name).read_text())
    rows = {r["size"]: r["busbw"] for r in parsed}
    points = PROFILES[profile][side].points
    assert len(points) >= 4
    assert all(rows[size] == pytest.approx(bw) for size, bw in points)  # copied, out-of-place busbw
    eight = next(r for r in parsed if r["size"] == 8)  # the small-message latency: the 8-byte row's time
    assert PROFILES[profile][side].latency_s == pytest.approx(eight["time_us"] * 1e-6)


def test_every_device_people_use_has_a_profile_with_its_source_and_the_rest_say_how_to_measure():
    for key in ("MI300X", "MI325X", "H100-SXM", "H200", "A100"):
        p = profile_for(key)
        assert p and p["source"] and p["gpus_per_node"] == 8
        sizes = [s for s, _ in p["intra"].points]
        assert sizes == sorted(sizes) and all(bw > 0 for _, bw in p["intra"].points)
    assert profile_for("h100-sxm") is PROFILES["h100-sxm"]
    assert PROFILES["mi325x"]["topology"] == "full-mesh" and PROFILES["h100-sxm"]["topology"] == "switch"
    # the plateaus the sources give: 370 GB/s ring on 8 H100 (scaled ramp), 200 on 8 A100, 316.88 on 8 MI325X
    assert PROFILES["h100-sxm"]["intra"].busbw(8 << 30) == pytest.approx(370 * 304.96 / 315.69, rel=1e-3)
    assert PROFILES["a100"]["inter"].busbw(1 << 30) == 96.0
    assert PROFILES["h200"]["intra"] is PROFILES["h100-sxm"]["intra"]
    for key in ("MI250X-GCD", "H100-PCIE", "B200"):
        assert profile_for(key) is None
        assert "commbench" in missing(key) and key in missing(key)


def test_nvidia_devices_no_longer_scale_perfectly_for_any_job():
    """The issue: every device but MI300X got 8.00x / 100% for any job (compute only)."""
    for name in ("h100-sxm", "h200", "a100", "mi325x"):
        p = PROFILES[name]
        inp = Inputs(compute_s=0.5, grad_bytes=8e9 * 2, intra=p["intra"], inter=p["inter"], overlap=0.8,
                     topology=p["topology"])
        rows = {r["workers"]: r for r in table(inp, [1, 8, 16])}
        assert rows[8]["efficiency"] < 1.0 and rows[16]["efficiency"] < rows[8]["efficiency"]
    # a PCIe box without P2P scales far worse than NVSwitch on the same job (1B parameters, fp32 gradients)
    pcie = Inputs(compute_s=0.5, grad_bytes=4e9, intra=PROFILES["pcie"]["intra"])
    nvs = Inputs(compute_s=0.5, grad_bytes=4e9, intra=PROFILES["h100-sxm"]["intra"])
    assert table(pcie, [8])[0]["efficiency"] < 0.5 * table(nvs, [8])[0]["efficiency"]


def test_plan_times_an_nvidia_job_with_its_profile_and_names_the_missing_ones(tmp_path, capsys):
    from transformers import LlamaConfig

    from scaletrain.cli import main

    d = tmp_path / "llama1b"
    LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=4).save_pretrained(d)  # config.json only
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name_or_path: {d}, task: causal-lm, finetuning_type: full}}\n"
                   f"data: {{train_file: x.jsonl, max_length: 2048}}\ntrain: {{strategy: ddp, bf16: true}}\n")
    timing = {}
    for device in ("h100", "mi250x"):
        assert main(["plan", str(cfg), "--device", device, "--gpus", "1,8,16", "--json"]) == 0
        timing[device] = json.loads(capsys.readouterr().out)["timing"]
    h100 = {r["workers"]: r for r in timing["h100"]}
    assert h100[1]["speedup"] == 1.0 and h100[8]["speedup"] < 8 and h100[16]["efficiency"] < h100[8]["efficiency"]
    assert h100[16]["nodes"] == 2 and h100[16]["exposed_comm_s"] > 0
    assert all(r["note"].startswith("compute only: no network profile for MI250X") and "commbench" in r["note"]
               for r in timing["mi250x"])


def test_scale_measures_both_the_exposed_communication_and_the_wait_for_the_slowest_rank(tmp_path):
    """#75: a 2-worker run's records: the breakdown's exposed communication, the slowest rank's lead at the
    gradient sync (ranks/ready_s) over the step, and their sum, the step's share in communication and waiting."""
    from scaletrain.scaling.sweep import COLUMNS, measure

    run = tmp_path / "two"
    run.mkdir()
    train = [{"kind": "train", "step": s, "time/step_s": 1.0, "ranks/ready_s": [0.5, 0.7],
              "throughput/samples_per_s": 8.0, "throughput/tokens_per_s": 800.0, "ranks/rss_gib": [1.0, 1.0]}
             for s in range(1, 6)]
    breakdown = [{"kind": "breakdown", "step": s, "share/exposed_comm": 0.2, "share/data_wait": 0.01}
                 for s in (3, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train + breakdown))
    (run / "summary.json").write_text(json.dumps({"eval_time_s": 0.0}))
    row = measure(run, warmup=1, world=2)
    assert row["wait_share"] == pytest.approx(0.1) and row["exposed_comm_share"] == pytest.approx(0.2)
    assert row["comm_wait_share"] == pytest.approx(0.3)
    assert COLUMNS.index("exposed_comm_share") < COLUMNS.index("comm_wait_share")

"""Each preflight check with faked facts: it passes on a healthy machine and fails/warns on the broken one."""

from scaletrain.config import validate
from scaletrain.launch.doctor import (
    GIB,
    Facts,
    Status,
    check_batch_lr,
    check_cpu_headroom,
    check_disk,
    check_nofile,
    check_paths,
    check_port,
    check_rocm_hints,
    check_shm,
    check_smoke,
    check_topology,
    check_visible_devices,
    check_workers,
    run_checks,
    worker_fit,
)


def facts(**kw):
    base = dict(environ={}, vendor="cpu", gpu_count=0, shm_bytes=16 * GIB, nofile_soft=65536,
                disk_free_bytes=100 * GIB, port_free=True)
    base.update(kw)
    return Facts(**base)


def cfg(workers=2, **train):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x.jsonl"},
                     "scaling": {"num_workers": workers}, "train": train})


def test_healthy_machine_all_ok():
    results = run_checks(facts(config=cfg(2, lr_scaling="linear"), cluster={"CPU": 4.0}, smoke=(True, "sum 3")))
    assert {r.status for r in results} == {Status.OK}
    assert {r.name for r in results} >= {"workers", "visible devices", "/dev/shm", "rendezvous port", "open files",
                                         "disk", "data and model", "batch and LR", "topology", "all-reduce smoke test"}


def test_workers_vs_cluster():
    r = check_workers(facts(config=cfg(8), cluster={"CPU": 64.0, "GPU": 4.0}))
    assert r.status is Status.FAIL and "needs 8 GPUs; the cluster has 4" in r.detail
    assert "lower scaling.num_workers to 4" in r.fix
    assert check_workers(facts(config=cfg(4), cluster={"CPU": 64.0, "GPU": 4.0})).status is Status.OK
    assert check_workers(facts()) is None  # no config: nothing to compare


def test_worker_fit_capacity():
    assert worker_fit(cfg(2), {"CPU": 8.0, "GPU": 3.0}).capacity == 3
    half = validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x.jsonl"},
                     "scaling": {"num_workers": 2, "resources_per_worker": {"CPU": 0.5}}})
    assert worker_fit(half, {"CPU": 2.0}).capacity == 4 and worker_fit(half, {"CPU": 2.0}).fills_cpus(4, "ray")
    none = half.model_copy(update={"scaling": half.scaling.model_copy(update={"resources_per_worker": {"CPU": 0}})})
    assert worker_fit(none, {"CPU": 2.0}).capacity > 1000  # asks for no CPU: no limit, no division by zero


def _launcher(config, launcher):
    return config.model_copy(update={"scaling": config.scaling.model_copy(update={"launcher": launcher})})


def test_cpu_headroom_under_ray(monkeypatch):
    ray = _launcher(cfg(2), "ray")
    r = check_cpu_headroom(facts(config=ray, cluster={"CPU": 2.0}))
    assert r.status is Status.WARN and "2 CPU worker(s) x 1 CPU take all 2 CPUs" in r.detail
    assert "scaling.launcher=torchrun" in r.fix
    assert check_cpu_headroom(facts(config=ray, cluster={"CPU": 4.0})) is None  # a core left for Ray
    assert check_cpu_headroom(facts(config=ray, cluster={"CPU": 64.0, "GPU": 2.0})) is None  # GPU workers
    assert check_cpu_headroom(facts(config=_launcher(cfg(2), "torchrun"), cluster={"CPU": 2.0})) is None  # no Ray
    # the default (auto) runs 2 workers on a 2-core box under torchrun: nothing of Ray's shares their cores
    monkeypatch.setattr("scaletrain.launch.launcher.os.cpu_count", lambda: 2)
    monkeypatch.setattr("scaletrain.launch.launcher.GPU_DEVICE_FILES", ())
    monkeypatch.setattr("scaletrain.launch.launcher.ray_running", lambda: False)
    monkeypatch.setattr("scaletrain.launch.warm.cluster.current", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert check_cpu_headroom(facts(config=cfg(2), cluster={"CPU": 2.0})) is None


def test_visible_device_conflicts():
    rocm = lambda env: check_visible_devices(facts(vendor="rocm", environ=env))
    assert rocm({"ROCR_VISIBLE_DEVICES": "0,1"}).status is Status.WARN
    bad = rocm({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert bad.status is Status.FAIL and "unset CUDA_VISIBLE_DEVICES" in bad.fix
    assert rocm({"HIP_VISIBLE_DEVICES": "0,1"}).status is Status.OK
    assert check_visible_devices(facts(vendor="cuda", environ={"HIP_VISIBLE_DEVICES": "1"})).status is Status.WARN


def test_shm_sizes():
    assert check_shm(facts(shm_bytes=64 * 1024**2)).status is Status.FAIL  # Docker's default
    assert check_shm(facts(shm_bytes=1 * GIB)).status is Status.WARN
    assert "--shm-size" in check_shm(facts(shm_bytes=1 * GIB)).fix
    assert check_shm(facts(shm_bytes=32 * GIB)).status is Status.OK


def test_port_nofile_disk():
    assert check_port(facts(port_free=False)).status is Status.FAIL
    assert check_nofile(facts(nofile_soft=1024)).status is Status.WARN
    assert check_disk(facts(disk_free_bytes=GIB // 2)).status is Status.FAIL
    assert check_disk(facts(disk_free_bytes=5 * GIB)).status is Status.WARN


def test_paths_and_batch_lr():
    r = check_paths(facts(config=cfg(), path_errors=["data.train_file=x.jsonl: file not found"]))
    assert r.status is Status.FAIL and "x.jsonl" in r.detail
    warn = check_batch_lr(facts(config=cfg(4)))
    assert warn.status is Status.WARN and "global batch 32 (8 on 1 worker)" in warn.detail
    assert check_batch_lr(facts(config=cfg(4, lr_scaling="sqrt"))).status is Status.OK
    assert check_batch_lr(facts(config=cfg(1))).status is Status.OK


def test_rocm_hints_only_on_rocm():
    assert check_rocm_hints(facts(vendor="cuda")) is None
    r = check_rocm_hints(facts(vendor="rocm", kernel_cmdline="quiet", topology_warnings=["... talk over PCIe: "
                                                                                         "GPU0-GPU1 (PCIE)"]))
    assert r.status is Status.WARN and "iommu=pt" in r.detail and "HSA_FORCE_FINE_GRAIN_PCIE" in r.detail
    ok = check_rocm_hints(facts(vendor="rocm", kernel_cmdline="iommu=pt", environ={"HSA_FORCE_FINE_GRAIN_PCIE": "1"}))
    assert ok.status is Status.OK


def test_topology_and_smoke():
    assert check_topology(facts(gpu_count=8, topology_warnings=["2 GPU pair(s) ..."])).status is Status.WARN
    assert check_topology(facts(gpu_count=8)).status is Status.OK
    assert check_smoke(facts(smoke=(False, "timed out"))).status is Status.FAIL
    assert check_smoke(facts()) is None


def test_doctor_flags_gpus_with_uncorrectable_errors_or_a_pending_retirement():
    from scaletrain.launch.doctor import Status, check_gpu_health

    healthy = {"bus_id": "0000:1b:00.0", "ecc_uncorrected": 0, "retirement_pending": False}
    sick = {"bus_id": "0000:9a:00.0", "ecc_uncorrected": 3, "retirement_pending": True}
    assert check_gpu_health(facts(gpu_health=[])) is None  # no reader: nothing to say
    assert check_gpu_health(facts(gpu_health=[healthy])).status == Status.OK
    r = check_gpu_health(facts(gpu_health=[healthy, sick]))
    assert r.status == Status.WARN and "0000:1b" not in r.detail
    assert "GPU 0000:9a:00.0: 3 uncorrectable ECC error(s), a page retirement pending" in r.detail


def test_doctor_names_how_an_moe_models_experts_compute_here(tmp_path, monkeypatch):
    """From config.json alone (no weights): the experts and whether torch has a grouped GEMM kernel on this device;
    transformers' per-expert fallback is a warning, a dense model says nothing."""
    from types import SimpleNamespace

    from transformers import Qwen3MoeConfig

    from scaletrain.commands.doctor import _experts
    from scaletrain.launch.doctor import check_experts

    Qwen3MoeConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=64, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                   head_dim=8).save_pretrained(tmp_path / "moe")
    moe_cfg = validate({"model": {"name_or_path": str(tmp_path / "moe"), "task": "causal-lm"},
                        "data": {"train_file": "x.jsonl"}})
    cpu = SimpleNamespace(has_gpu=False)
    said = _experts(moe_cfg, cpu)
    assert said == "8 experts, top-2; on cpu the experts compute as one grouped GEMM per projection (torch's kernel)"
    assert check_experts(facts(experts=said)).status == Status.OK
    import transformers.integrations.moe as moe

    monkeypatch.setattr(moe, "_can_use_grouped_mm", lambda *a: False)
    slow = _experts(moe_cfg, cpu)
    assert "transformers' fallback: one matmul per active expert" in slow
    assert check_experts(facts(experts=slow)).status == Status.WARN
    assert _experts(validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                              "data": {"train_file": "x.jsonl"}}), cpu) is None
    assert check_experts(facts()) is None

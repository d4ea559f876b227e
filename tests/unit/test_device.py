"""Backend choice and device mapping with faked ROCm / CUDA / CPU environments."""

import pytest

from scaletrain.comm.device import Platform, local_device_index, reconcile_rocr, select_backend
from scaletrain.errors import LaunchError

ROCM8 = Platform("rocm", 8, "2.13.0+rocm7.0")
CUDA8 = Platform("cuda", 8, "2.13.0+cu130")
CPU = Platform("cpu", 0, "2.13.0+cpu")


@pytest.mark.parametrize("platform,expected", [(ROCM8, "nccl"), (CUDA8, "nccl"), (CPU, "gloo")])
def test_auto_backend(platform, expected):
    assert select_backend("auto", platform).backend == expected


def test_rccl_is_nccl_on_rocm_with_note():
    choice = select_backend("rccl", ROCM8)
    assert choice.backend == "nccl" and "RCCL" in choice.note


def test_rccl_on_cuda_is_an_error():
    with pytest.raises(LaunchError, match="set comm.backend=nccl or auto"):
        select_backend("rccl", CUDA8)


@pytest.mark.parametrize("requested", ["nccl", "rccl"])
def test_nccl_without_gpu_is_a_clear_error(requested):
    with pytest.raises(LaunchError, match=f"comm.backend={requested} needs a GPU.*CPU-only build.*set "
                                          f"comm.backend=gloo or auto"):
        select_backend(requested, CPU)


def test_gloo_always_allowed():
    assert select_backend("gloo", CUDA8).backend == "gloo"


def test_rocm_ray_v2_worker_sees_only_its_gpu():
    # Ray sets HIP_VISIBLE_DEVICES=<own gpu>, Train V2 shares CUDA_VISIBLE_DEVICES=<all gpus>:
    # torch sees 1 device, so the index must be 0, not the local rank (ray-project/ray#49260).
    env = {"HIP_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert local_device_index("rocm", env, local_rank=3, device_count=1, assigned_ids=["3"]) == 0


def test_rocm_whole_node_visible_indexes_by_assigned_id():
    # With RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES every GPU is visible: index by position.
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert local_device_index("rocm", env, local_rank=0, device_count=4, assigned_ids=["6"]) == 2


def test_rocm_hip_list_wins_when_it_matches_device_count():
    env = {"HIP_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert local_device_index("rocm", env, local_rank=1, device_count=2, assigned_ids=["3"]) == 1


def test_cuda_shared_visible_devices():
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert local_device_index("cuda", env, local_rank=1, device_count=4, assigned_ids=["2"]) == 2


def test_cuda_hip_variable_is_ignored():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"}
    assert local_device_index("cuda", env, local_rank=0, device_count=2, assigned_ids=["1"]) == 1


def test_no_assignment_falls_back_to_local_rank():
    assert local_device_index("cuda", {}, local_rank=1, device_count=2) == 1


def test_local_rank_beyond_devices_names_rank_and_env():
    with pytest.raises(LaunchError,
                       match=r"local rank 2 has no GPU: torch sees 2 device\(s\) \(CUDA_VISIBLE_DEVICES=0,1\)"):
        local_device_index("cuda", {"CUDA_VISIBLE_DEVICES": "0,1"}, local_rank=2, device_count=2)


def test_rocr_in_shell_becomes_hip_for_ray():
    changes, note = reconcile_rocr({"ROCR_VISIBLE_DEVICES": "4,5,6"})
    assert changes == {"HIP_VISIBLE_DEVICES": "0,1,2"} and "ROCR_VISIBLE_DEVICES=4,5,6" in note


def test_user_hip_value_is_never_replaced():
    assert reconcile_rocr({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1"}) == ({}, None)
    assert reconcile_rocr({}) == ({}, None)

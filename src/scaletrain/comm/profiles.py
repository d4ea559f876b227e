"""Named comm environment profiles and the table of real NCCL/RCCL/torch variable names.

``comm.profile`` names a shipped profile (``src/scaletrain/profiles/<name>.yaml``) or a YAML file;
its ``env`` is applied first and ``comm.env`` overrides it. Every name is checked: misquoted ones get
a specific explanation, unknown ones the nearest real name.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml

from scaletrain.envvars import COMM_PREFIXES, MISQUOTED_ENV
from scaletrain.errors import ConfigError
from scaletrain.textfile import read_text

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"

# Variables NCCL, RCCL, torch.distributed, HSA and gloo actually read (a working subset, not every knob).
KNOWN_VARS = frozenset("""
NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_ALGO NCCL_PROTO NCCL_MIN_NCHANNELS NCCL_MAX_NCHANNELS
NCCL_MIN_CTAS NCCL_MAX_CTAS NCCL_NTHREADS NCCL_BUFFSIZE NCCL_P2P_DISABLE NCCL_P2P_LEVEL NCCL_SHM_DISABLE
NCCL_IB_DISABLE NCCL_IB_HCA NCCL_IB_GID_INDEX NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_QPS_PER_CONNECTION
NCCL_IB_TC NCCL_IB_SL NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_SOCKET_IFNAME NCCL_SOCKET_NTHREADS
NCCL_NSOCKS_PERTHREAD NCCL_CROSS_NIC NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_GRAPH_DUMP_FILE NCCL_LAUNCH_MODE
NCCL_CUMEM_ENABLE NCCL_NVLS_ENABLE NCCL_COLLNET_ENABLE NCCL_CHECKS_DISABLE NCCL_NET NCCL_NET_PLUGIN
NCCL_SET_THREAD_NAME NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_IGNORE_CPU_AFFINITY NCCL_NVB_DISABLE
NCCL_PXN_DISABLE NCCL_CONNECT_TIMEOUT NCCL_RUNTIME_CONNECT NCCL_WORK_FIFO_DEPTH NCCL_TUNER_PLUGIN
NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_SPLIT_DATA_ON_QPS NCCL_NET_SHARED_BUFFERS NCCL_ENABLE_DMABUF_SUPPORT
RCCL_MSCCL_ENABLE RCCL_MSCCL_FORCE_ENABLE RCCL_MSCCLPP_ENABLE RCCL_MSCCLPP_THRESHOLD RCCL_LL128_FORCE_ENABLE
RCCL_KERNEL_COLL_TRACE_ENABLE RCCL_ENABLE_SIGNALHANDLER
TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_NCCL_DUMP_ON_TIMEOUT
TORCH_NCCL_DESYNC_DEBUG TORCH_NCCL_ENABLE_TIMING TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_AVOID_RECORD_STREAMS
TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_USE_COMM_NONBLOCKING TORCH_NCCL_ENABLE_MONITORING
TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC
TORCH_FR_DUMP_TEMP_FILE TORCH_DISTRIBUTED_DEBUG TORCH_CPP_LOG_LEVEL TORCH_SHOW_CPP_STACKTRACES
HSA_FORCE_FINE_GRAIN_PCIE HSA_NO_SCRATCH_RECLAIM HSA_ENABLE_SDMA HSA_OVERRIDE_GFX_VERSION HSA_ENABLE_INTERRUPT
GLOO_SOCKET_IFNAME GLOO_DEVICE_TRANSPORT
""".split())


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str) -> dict[str, str]:
    path = PROFILES_DIR / f"{name}.yaml" if (PROFILES_DIR / f"{name}.yaml").is_file() else Path(name)
    if not path.is_file():
        raise ConfigError(f"comm.profile={name}: no such profile; use one of {', '.join(available())} "
                          f"or the path of a YAML file with an env: mapping")
    try:
        data = yaml.safe_load(read_text(path, f"comm.profile={name}:")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"comm.profile={name}: {path} is not YAML ({str(e).splitlines()[0]})") from None
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise ConfigError(f"comm.profile={name}: {path} needs an env: mapping of variable names to values")
    return {str(k): str(v) for k, v in env.items()}


def effective_env(profile: str | None, env: dict[str, str]) -> dict[str, str]:
    """Profile values first; comm.env wins for any name it sets."""
    out = load_profile(profile) if profile else {}
    out.update(env)
    return out


def check_names(names) -> list[str]:
    """Warnings for misquoted names and unknown NCCL/RCCL/torch names (with the nearest real one)."""
    out = []
    for name in names:
        if name in MISQUOTED_ENV:
            out.append(f"{name}: {MISQUOTED_ENV[name]}")
        elif name.startswith(COMM_PREFIXES) and name not in KNOWN_VARS:
            near = difflib.get_close_matches(name, KNOWN_VARS, n=1, cutoff=0.6)
            out.append(f"{name}: not a variable NCCL/RCCL/torch reads" + (f"; did you mean {near[0]}?" if near else ""))
    return out

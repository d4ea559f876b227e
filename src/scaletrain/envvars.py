"""Every environment variable scaletrain reads or sets, named once, with its default: the ground floor.

Only this module touches ``os.environ`` (``read``, ``snapshot``, ``apply``, ...); everything else names a
variable through its constant here and receives values through the config or the frozen worker context. It
imports nothing of scaletrain's but ``credentials`` (what looks like a secret), so any layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Iterator, Mapping

from scaletrain.credentials import looks_like_secret

# Visible-device variables. Ray sets HIP_VISIBLE_DEVICES per worker on AMD, Ray Train V2 shares
# CUDA_VISIBLE_DEVICES across the workers of a node, and ROCR_VISIBLE_DEVICES filters devices
# below HIP (a user's shell or a container may set it).
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
HIP_VISIBLE_DEVICES = "HIP_VISIBLE_DEVICES"
ROCR_VISIBLE_DEVICES = "ROCR_VISIBLE_DEVICES"
VISIBLE_DEVICE_VARS = (HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES)

# Offline model loading: workers never reach a hub.
HF_HUB_OFFLINE = "HF_HUB_OFFLINE"
TRANSFORMERS_OFFLINE = "TRANSFORMERS_OFFLINE"
# Silence the tokenizers fork warning; tokenization happens once in the driver.
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"

# CPU threads per worker process (torchrun sets 1 only with several processes per node; Ray sets the CPUs).
OMP_NUM_THREADS = "OMP_NUM_THREADS"
# glibc: allocations of at least this many bytes are mmap'ed and returned to the kernel when freed. Its default
# threshold grows after each free (up to 32 MiB), so freed tensors stay in the heap and a CPU worker's resident
# set is an upper bound of its live memory. Fixed at 64 KiB (comm.env: {MALLOC_MMAP_THRESHOLD_: 65536}), the
# measured peak (memory/measure.py) is within a few percent of the tensors alive at the peak; not a default: a
# fresh mmap per large tensor costs a third of CPU training throughput (benchmarks/RESULTS.md, packing).
MALLOC_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
CPU_MMAP_THRESHOLD_BYTES = "65536"

# Variables torch.distributed.run (torchrun) sets for every worker process.
TORCHRUN_RANK, TORCHRUN_LOCAL_RANK, TORCHRUN_WORLD_SIZE = "RANK", "LOCAL_RANK", "WORLD_SIZE"
TORCHRUN_LOCAL_WORLD_SIZE, TORCHRUN_NODE_RANK = "LOCAL_WORLD_SIZE", "GROUP_RANK"
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE"

# ROCm: RCCL needs fine-grained PCIe memory for peer access between GPUs that talk over PCIe.
HSA_FORCE_FINE_GRAIN_PCIE = "HSA_FORCE_FINE_GRAIN_PCIE"
# ROCm's fused attention (AOTriton) on RDNA GPUs is experimental and off unless this is 1 (attention.py)
TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"

# Ray
RAY_ADDRESS = "RAY_ADDRESS"
# Ray reads no .gitignore while it packages a job's working_dir (launch/job_files.py gives it their patterns instead)
RAY_RUNTIME_ENV_IGNORE_GITIGNORE = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"
RAY_TRAIN_V2_ENABLED = "RAY_TRAIN_V2_ENABLED"
# Ray would give each ROCm worker HIP_VISIBLE_DEVICES=<its GPU> while Train V2 shares
# CUDA_VISIBLE_DEVICES=<all GPUs of the node>; the two views disagree and device indices break
# (ray-project/ray#49260). "1" keeps HIP's view whole so both index the same list.
RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"
# Train V2 is the default from Ray 2.51; set in the driver before Ray starts so an older default never picks V1.
RAY_DRIVER_DEFAULTS: dict[str, str] = {RAY_TRAIN_V2_ENABLED: "1"}
# Ray's token authentication (Ray >= 2.52): a head started with RAY_AUTH_MODE=token, or with a token on file,
# requires the token of every driver and client; a driver must set the mode before ray is imported. Ray finds the
# token in RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token (launch/cluster_auth.py).
RAY_AUTH_MODE = "RAY_AUTH_MODE"
RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
RAY_DEFAULT_TOKEN_FILE = "~/.ray/auth_token"
WARM_CLUSTER_DRIVER_DEFAULTS: dict[str, str] = {RAY_AUTH_MODE: "token"}
TOKEN_DRIVER_DEFAULTS = WARM_CLUSTER_DRIVER_DEFAULTS  # any cluster that requires the token
# Ray Train's preemption watcher is one more actor that wakes its core-worker loop 100 times a second
# (~0.9% of a core, measured) to watch for node preemption, which an embedded single-machine Ray never sees.
RAY_TRAIN_ENABLE_PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"

# Set in the driver when scaletrain starts an embedded local Ray (a user's value wins); a cluster keeps Ray's.
# An embedded Ray has no dashboard and nothing that scrapes its metrics, yet every one of its processes collects
# them and keeps per-event-loop statistics: with both off its runtime's CPU during training falls from ~4.8% to
# ~3.7% of a core (2 MiniLM workers on 2 cores: benchmarks/overhead.py --part breakdown), CPU the workers get back.
RAY_ENABLE_METRICS_COLLECTION, RAY_EVENT_STATS = "RAY_enable_metrics_collection", "RAY_event_stats"
LOCAL_RAY_DEFAULTS: dict[str, str] = {
    RAY_TRAIN_ENABLE_PREEMPTION_WATCHER: "0",
    RAY_ENABLE_METRICS_COLLECTION: "0",
    RAY_EVENT_STATS: "0",
}

# `scaletrain eval` (harness.py): lm-eval's model and task data only from this machine (a user's value wins).
HF_DATASETS_OFFLINE = "HF_DATASETS_OFFLINE"
EVAL_DEFAULTS: dict[str, str] = {HF_HUB_OFFLINE: "1", HF_DATASETS_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1"}
# Set by `scaletrain eval --workers N` in the processes torchrun starts: each evaluates its share (lm-eval's own
# data-parallel split) instead of launching again.
SCALETRAIN_EVAL_WORKER = "SCALETRAIN_EVAL_WORKER"


def eval_worker_env(processes: int) -> dict[str, str]:
    """The environment of `scaletrain eval --workers N`'s processes: marked as workers, and the cores shared among
    them where the user set no thread count (torchrun would set 1 and warn)."""
    threads = os.environ.get(OMP_NUM_THREADS) or str(max(1, (os.cpu_count() or 1) // processes))
    return {**os.environ, SCALETRAIN_EVAL_WORKER: "1", OMP_NUM_THREADS: threads}

# glibc's malloc hands freed memory back to the OS above its trim threshold, and serves a non-main thread from an
# arena of its own that it grows and shrinks in 64 MiB heaps. A CPU training step frees and reallocates its
# activations and gradients every step, so each step faults them in again: 45,000-56,000 page faults a second per
# MiniLM worker, 8-12% of its training thread's CPU in the kernel, the most under Ray, whose actor trains in a
# thread of its own (benchmarks/overhead.py --part breakdown). The largest mmap threshold glibc allows (32 MiB), a
# 4 GiB trim threshold and one arena keep the freed pages for the next step, in the same place for every thread:
# 0.28 vs 0.31 s a step under torchrun; the process holds its step's peak between steps (+0.02 GiB here). glibc's
# own variables, read by the loader when a process starts: set in the environment a CPU worker starts with. One
# variable each rather than GLIBC_TUNABLES's a:b:c list, which Ray's runtime_env cuts at the first colon.
GLIBC_TUNABLES = "GLIBC_TUNABLES"
CPU_WORKER_ENV_DEFAULTS: dict[str, str] = {
    MALLOC_MMAP_THRESHOLD: "33554432",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
    "MALLOC_ARENA_MAX": "1",
}


def cpu_worker_env(*environs: Mapping[str, str]) -> dict[str, str]:
    """The variables a CPU worker starts with beside the others; none where the user's environment (``environs``,
    default this process's) sets glibc's allocator already (GLIBC_TUNABLES or a MALLOC_ variable such as
    MALLOC_MMAP_THRESHOLD_, which memory measurement uses): theirs is kept whole."""
    for environ in environs or (os.environ,):
        if any(k == GLIBC_TUNABLES or k.startswith("MALLOC_") for k in environ):
            return {}
    return dict(CPU_WORKER_ENV_DEFAULTS)


# Variables every worker gets from the driver (values shown are scaletrain's defaults).
WORKER_ENV_DEFAULTS: dict[str, str] = {
    HF_HUB_OFFLINE: "1",
    TRANSFORMERS_OFFLINE: "1",
    TOKENIZERS_PARALLELISM: "false",
}

# Prefixes of the communication libraries' variables (NCCL/RCCL, torch.distributed, ROCm's HSA runtime, gloo):
# shown by `scaletrain env`, checked for misspellings, and copied from the driver's shell to the workers.
COMM_PREFIXES = ("NCCL_", "RCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "HSA_", "GLOO_")
# Copied from the driver's shell to the workers, so `NCCL_DEBUG=INFO scaletrain train ...` behaves as users
# expect (HF_: the hub cache and offline settings).
# Object storage (a run on s3:// etc.): the workers write checkpoints there with the driver's credentials; the
# secret ones travel privately (comm/launch_env.py), never in Ray's runtime_env.
STORAGE_PREFIXES = ("AWS_", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_")
PROPAGATED_PREFIXES = (*COMM_PREFIXES, "HF_", *STORAGE_PREFIXES)


# The C++ compiler inductor builds CPU kernels with (train.compile on CPU workers; g++ where unset).
CXX = "CXX"


def read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if environ is None else environ).get(name)


def worker_env(
    config_env: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for every worker: defaults < driver's shell (comm prefixes) < comm.env.

    A shell value that ``comm.env`` overrides is reported with a warning, never replaced silently.
    """
    environ = os.environ if environ is None else environ
    out = dict(WORKER_ENV_DEFAULTS)
    out.update({k: v for k, v in environ.items() if k.startswith(PROPAGATED_PREFIXES)})
    for key, value in config_env.items():
        shell = environ.get(key)
        if shell is not None and shell != value:
            secret = looks_like_secret(key, value) or looks_like_secret(key, shell)
            what = ("sets another value than your shell" if secret  # names only: both values may be secrets
                    else f"sets {value!r}, your shell has {shell!r}")
            warnings.warn(f"{key}: comm.env {what}; the config value wins (remove it from comm.env to keep the "
                          f"shell's)", stacklevel=2)
        out[key] = value
    return out


# --- Hang detection and collective timeouts (nccl; RCCL reads the same TORCH_NCCL_* names) -------------
TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
TORCH_NCCL_TRACE_BUFFER_SIZE = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # flight recorder entries
TORCH_NCCL_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
TORCH_FR_DUMP_TEMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"  # flight recorder dump path prefix


def apply_defaults(values: Mapping[str, str]) -> None:
    """Set variables in this process that are not set yet (a user's value wins)."""
    for key, value in values.items():
        os.environ.setdefault(key, value)


def apply(values: Mapping[str, str]) -> None:
    """Set variables in this process (for values computed from what the user set, e.g. reconcile_rocr)."""
    os.environ.update(values)


@contextlib.contextmanager
def applied(values: Mapping[str, str]) -> Iterator[None]:
    """Set variables in this process for a block, then put back what was there (a worker run in the driver's own
    process: launch/local.py)."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# The warm cluster's fork server (launch/warm/forkserver.py) hands Ray a worker forked from a process that
# imported torch, transformers and Ray Train's dependencies once (not Ray itself). Variables these libraries, the
# loader or the interpreter read when they load must have the server's values, or the worker is started the plain
# way. Exceptions: Ray's own per-worker variables and Train V2's, torchrun's per-worker ones (TORCHELASTIC_*, and
# TORCH_NCCL_* read when a process group starts) (all read when used), and the thread counts, which the worker
# applies itself (apply_threads: libgomp read OMP_NUM_THREADS when the server loaded torch).
FORK_MATCHED_PREFIXES = ("LD_", "MALLOC_", "PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH_", "HF_",
                         "TRANSFORMERS_", "ARROW_", "RAY_")
# KMP_DUPLICATE_LIB_OK only stops Intel's OpenMP runtime from aborting on a second copy of itself (torch here loads
# GNU's); scikit-learn sets it when imported, so a driver that imported it would never match; KMP_INIT_AT_FORK
# (Intel's runtime again) joblib sets when imported (28 plain torchrun workers in a measured make test).
# RAY_AUTH_MODE is read by Ray, which the server never imports (a child imports it under its own value); a driver's
# local Ray sets it in the driver's process, so its later torchrun workers would never match.
FORK_UNMATCHED = frozenset({"PYTHONPATH", "PYTHONBREAKPOINT", OMP_NUM_THREADS, "MKL_NUM_THREADS",
                            "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", RAY_AUTH_MODE, "RAY_JOB_ID", "RAY_RAYLET_PID",
                            "RAY_CLIENT_MODE", "RAY_LD_PRELOAD_ON_WORKERS", "RAY_USAGE_STATS_ENABLED",
                            "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"})
FORK_UNMATCHED_PREFIXES = ("RAY_TRAIN_", "TORCHELASTIC_", "TORCH_NCCL_")

# A fork server's socket (launch/warm/forkserver.py) that forks this node's torchrun workers pre-imported instead of
# starting each a fresh interpreter (torch, transformers and the loop imported once); unset: the warm cluster's
# server when `scaletrain up` runs one here, else none. The test suite starts one for its torchrun runs.
SCALETRAIN_FORKSERVER = "SCALETRAIN_FORKSERVER"

# Set by a driver before it starts an embedded Ray (launch/orphans.py): "<pid>:<start time>" of the driver, inherited
# by every process that Ray starts, so a reaper stops them when the driver dies (even by SIGKILL), and the next
# `train` or `doctor` names any that are left.
SCALETRAIN_RUN_DRIVER = "SCALETRAIN_RUN_DRIVER"

# Set in a driver that the fork server started (`scaletrain train` on the warm cluster): it runs the command itself.
SCALETRAIN_FORKED_DRIVER = "SCALETRAIN_FORKED_DRIVER"


def replace_all(values: Mapping[str, str]) -> None:
    """Make this process's environment exactly ``values`` (a forked worker taking its caller's)."""
    os.environ.clear()
    os.environ.update(values)


def apply_threads(environ: Mapping[str, str] | None = None) -> None:
    """torch's CPU threads from OMP_NUM_THREADS, as a fresh process would have them: libgomp reads the variable
    when torch loads, which in a forked worker was before Ray set it."""
    value = read(OMP_NUM_THREADS, environ)
    torch = sys.modules.get("torch")
    if torch is not None and value and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def nccl_watchdog_env(flight_dir: str) -> dict[str, str]:
    """Make an nccl/RCCL collective that outlives the process-group timeout fail loudly and leave a trace."""
    return {
        TORCH_NCCL_ASYNC_ERROR_HANDLING: "1",
        TORCH_NCCL_TRACE_BUFFER_SIZE: "2000",
        TORCH_NCCL_DUMP_ON_TIMEOUT: "1",
        TORCH_FR_DUMP_TEMP_FILE: f"{flight_dir}/nccl_trace_rank_",
    }


# Names that are widely quoted but do not exist (or no longer work), with what to use instead.
MISQUOTED_ENV: dict[str, str] = {
    "NCCL_TIMEOUT": "NCCL has no timeout variable; set comm.timeout_s (the process-group timeout)",
    "RCCL_TIMEOUT": "RCCL has no timeout variable; set comm.timeout_s (the process-group timeout)",
    "RCCL_MIN_NRINGS": "not an RCCL variable; use NCCL_MIN_NCHANNELS (RCCL reads the NCCL_ names)",
    "RCCL_MAX_NRINGS": "not an RCCL variable; use NCCL_MAX_NCHANNELS (RCCL reads the NCCL_ names)",
    "NCCL_MIN_NRINGS": "renamed long ago; use NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NRINGS": "renamed long ago; use NCCL_MAX_NCHANNELS",
    "NCCL_ASYNC_ERROR_HANDLING": "deprecated in torch 2.2; use TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "deprecated in torch 2.2; use TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DEBUG_LEVEL": "not an NCCL variable; use NCCL_DEBUG=INFO (or WARN, TRACE)",
}


# --- Experiment trackers (the driver's monitor) ----------------------------------------------------------
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
WANDB_MODE = "WANDB_MODE"
# Where a tracker writes when the user says so (each tool's own variable wins over the run directory).
WANDB_DIR = "WANDB_DIR"
TENSORBOARD_LOGGING_DIR = "TENSORBOARD_LOGGING_DIR"  # transformers' TrainingArguments reads the same name
# MLflow 3 refuses its file store unless asked; a file: URI is scaletrain's default (no server to run).
MLFLOW_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
# An unreachable tracking server fails in seconds instead of MLflow's minutes of retries (a user's value wins).
TRACKER_DRIVER_DEFAULTS: dict[str, str] = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                                           "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


# --- Fault injection for tests and drills (never set in normal runs) -----------------------------------
# "KIND:RANK:STEP[:TIMES]" entries separated by ",": KIND is raise, exit or hang; the fault fires at the
# start of optimizer step STEP on rank RANK, at most TIMES times per run (default 1).
SCALETRAIN_FAULTS = "SCALETRAIN_FAULTS"

# --- Secrets: variables whose values never reach a log, config dump or error message ------------------
# Where a Ray worker finds the secret variables of its environment (see comm/launch_env.py): a 0600 file, not
# Ray's runtime_env, which Ray writes to its logs on every node and shows in its dashboard.
SCALETRAIN_PRIVATE_ENV_FILE = "SCALETRAIN_PRIVATE_ENV_FILE"


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment's secret variables, by name (HF_TOKEN, *_API_KEY, ...) or by shape (Bearer ...,
    sk-..., a random-looking value of a *KEY*/*AUTH* variable): see credentials.py; and Ray's auth token where it
    lies in a file (it is a secret wherever it is kept)."""
    environ = os.environ if environ is None else environ
    found = ray_auth_token(environ)
    return [v for k, v in environ.items() if looks_like_secret(k, v)] + ([found[0]] if found else [])


def ray_auth_token(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(Ray's auth token, where it was found) as Ray's own clients find it, or None: RAY_AUTH_TOKEN, else the file
    RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token; stripped of the spaces and newline an editor or `echo`
    leaves (Ray strips them too). An unreadable or empty file named by RAY_AUTH_TOKEN_PATH gives an empty token."""
    from pathlib import Path

    environ = os.environ if environ is None else environ
    if (value := (environ.get(RAY_AUTH_TOKEN) or "").strip()):
        return value, RAY_AUTH_TOKEN
    named = environ.get(RAY_AUTH_TOKEN_PATH)
    home = environ.get("HOME")  # the home of this environment (a copy passed in has its own, or none)
    if not named and not home:
        return None
    path = Path(named).expanduser() if named else Path(home) / RAY_DEFAULT_TOKEN_FILE.removeprefix("~/")
    try:
        value = path.read_text(errors="replace").strip()
    except OSError:
        return ("", f"{RAY_AUTH_TOKEN_PATH}={named}") if named else None
    where = f"{RAY_AUTH_TOKEN_PATH}={named}" if named else RAY_DEFAULT_TOKEN_FILE
    return (value, where) if value or named else None


def snapshot() -> dict[str, str]:
    """A copy of this process's environment, for preflight checks that inspect it."""
    return dict(os.environ)

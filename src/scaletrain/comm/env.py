"""Every environment variable scaletrain reads or sets, named once, with its default.

Only modules under ``comm/`` read the environment; everything else receives values through the
config or the frozen worker context.
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping

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

# Ray
RAY_ADDRESS = "RAY_ADDRESS"
RAY_TRAIN_V2_ENABLED = "RAY_TRAIN_V2_ENABLED"

# Variables every worker gets from the driver (values shown are scaletrain's defaults).
WORKER_ENV_DEFAULTS: dict[str, str] = {
    HF_HUB_OFFLINE: "1",
    TRANSFORMERS_OFFLINE: "1",
    TOKENIZERS_PARALLELISM: "false",
}

# Prefixes of communication variables that are copied from the driver's shell to the workers,
# so `NCCL_DEBUG=INFO scaletrain train ...` behaves as users expect.
PROPAGATED_PREFIXES = ("NCCL_", "RCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "HSA_", "GLOO_", "HF_")


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
            warnings.warn(
                f"{key}: comm.env sets {value!r}, your shell has {shell!r}; the config value wins "
                f"(remove it from comm.env to keep the shell's)",
                stacklevel=2,
            )
        out[key] = value
    return out

"""The start-up budget (accelerate's tests/test_imports.py holds `import accelerate` to one the same way): what a
fresh interpreter imports for `scaletrain --help`, and for a torchrun worker before its spec arrives. The budget is
the set of heavy packages each may import, not seconds (seconds vary 1.5x between two runs on this machine): a
regression is a package that appears, and the test names the module that imported it.

Heavy optional packages (Ray, vLLM, lm-eval, TRL, the trackers, matplotlib) load only in the processes that use
them. One exception is transformers' own: where torchao is installed (the `quant` extra), transformers imports it
in every process that loads its model code (its torchao quantizer, for checkpoints quantized with TorchAoConfig):
allowed only through transformers.quantizers, never from scaletrain's modules."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.loop

HEAVY = ("torch", "transformers", "peft", "datasets", "pyarrow", "pandas", "ray", "torchao", "vllm", "lm_eval",
         "trl", "wandb", "mlflow", "tensorboard", "matplotlib", "liger_kernel", "bitsandbytes", "math_verify",
         "PIL", "fsspec", "s3fs", "sklearn", "scipy")
LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|( *)(\S+)$")


def imports(code: str) -> list[tuple[int, str]]:
    """(depth, module) for every module a fresh interpreter imports running ``code``, in the order they finish."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(len(m.group(1)), m.group(2)) for m in map(LINE.match, proc.stderr.splitlines()) if m]


def heavy(found: list[tuple[int, str]]) -> dict[str, str]:
    """Each heavy package imported -> the first module outside it that imported it ("" at the top level)."""
    out = {}
    for i, (depth, name) in enumerate(found):
        if name in HEAVY and name not in out:
            parent = ""
            for d, n in found[i + 1:]:  # its importers finish after it, each less deep than the last
                if d < depth:
                    depth, parent = d, n
                    if not (n == name or n.startswith(name + ".")):
                        break
            out[name] = parent
    return out


def test_help_imports_no_heavy_package():
    found = heavy(imports("import sys; sys.argv = ['scaletrain', '--help']\n"
                          "from scaletrain.cli import main\n"
                          "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"))
    assert found == {}, found  # 0.4-0.7 s here: argparse, pydantic, yaml


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_torchrun_workers_imports_hold_no_optional_package():
    """What a torchrun worker imports while it waits for the spec (torchrun_entry's preload): torch, transformers'
    model code and HF datasets, nothing of Ray, serving, evaluation, RL or the trackers."""
    found = heavy(imports("from scaletrain.launch import torchrun_entry\n"
                          "from scaletrain.model.build import preload\n"
                          "preload()"))
    allowed = {"torch", "transformers", "datasets", "pyarrow", "pandas", "fsspec", "PIL", "scipy", "sklearn"}
    assert {"torch", "transformers", "datasets"} <= set(found), found
    extra = {k: v for k, v in found.items() if k not in allowed and k != "torchao"}
    assert extra == {}, extra
    if "torchao" in found:  # transformers' quantizer, never scaletrain
        assert found["torchao"].startswith("transformers."), found["torchao"]

import contextlib
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from scaletrain.data.demo import alpaca_rows, preference_rows, sentiment_rows, sharegpt_rows


def _share_the_cores() -> None:
    """Under ``pytest -n N`` (make test, make test-fast: N=2 on this 2-core machine) the N workers share the cores:
    each, and every process it starts that does not set its own (torchrun's, through the launcher; Ray's set theirs),
    gets cores // N of torch's intra-op threads instead of one per core, where N workers x all cores oversubscribed
    the machine (OpenMP's threads spinning against the other worker's). Measured on four loop files under -n 2:
    149 and 166 s with the default threads, 120 and 121 s with one each. A test's own OMP_NUM_THREADS wins; a
    single pytest process keeps torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores()
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
# Set by .ci/run: there the reference folder is laid beside the clone, so a missing file is a failure, not a skip.
REQUIRE_REFERENCE = "SCALETRAIN_REQUIRE_REFERENCE"


def reference_file(name: str) -> Path:
    """A file of ../shared/reference (real tool outputs; never copied into the project)."""
    path = REFERENCE / name
    if not path.is_file():
        if os.environ.get(REQUIRE_REFERENCE):
            pytest.fail(f"{path} is missing and {REQUIRE_REFERENCE} is set: CI must run the tests that read it")
        pytest.skip(f"{path} not present: these tests read the shared reference folder beside the checkout")
    return path


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("demo")
    with open(d / "sentiment.jsonl", "w") as f:
        for r in sentiment_rows(400, seed=1):
            f.write(json.dumps(r) + "\n")
    (d / "alpaca.json").write_text(json.dumps(alpaca_rows(240, seed=1)))
    with open(d / "chat.jsonl", "w") as f:
        for r in sharegpt_rows(240, seed=1):
            f.write(json.dumps(r) + "\n")
    with open(d / "preference.jsonl", "w") as f:
        for r in preference_rows(600, seed=2):
            f.write(json.dumps(r) + "\n")
    return d


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def classify_cfg(demo_dir, tmp_path) -> dict:
    return classify_dict(demo_dir, tmp_path)


def classify_dict(demo_dir: Path, tmp_path: Path) -> dict:
    """The small classification job most tests start from (tiny BERT on the demo sentiment data)."""
    return {
        "model": {"name_or_path": "builtin:tiny-bert", "task": "sequence-classification", "num_labels": 2},
        "data": {"train_file": str(demo_dir / "sentiment.jsonl"), "eval_ratio": 0.2, "max_length": 32},
        "train": {"per_device_train_batch_size": 8, "learning_rate": 1e-3, "max_steps": 12, "logging_steps": 2,
                  "seed": 7, "warmup_ratio": 0.0},
        "scaling": {"num_workers": 1},
        "output": {"output_dir": str(tmp_path / "runs")},
    }


def local_spec(cfg_dict: dict, run_dir: Path):
    """Prepare a job exactly as the driver does, for the in-process launcher."""
    from scaletrain.config import validate
    from scaletrain.launch.job import build_spec
    from scaletrain.launch.preflight import preflight

    cfg_dict = {**cfg_dict, "output": {"output_dir": str(run_dir.parent / "runs"), **cfg_dict.get("output", {})}}
    cfg = validate(cfg_dict)  # the tokenized-data cache lives under output_dir: the test's, not the checkout's
    run_dir.mkdir(parents=True, exist_ok=True)
    pre = preflight(cfg)  # as the driver: num_labels and label names from the data
    return pre.cfg, pre.tokenizer, build_spec(pre, run_dir, "gloo")


def resumes_bit_identical(cfg_dict: dict, root: Path, step: int, weights: str = "model.safetensors"
                          ) -> tuple[Path, Path]:
    """An uninterrupted in-process run, and one killed after its step-``step`` checkpoint (that checkpoint copied
    into a fresh run directory) then resumed: asserts the resume and that both final/ weights are equal to the bit;
    returns (whole, again) for the caller's own checks."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from scaletrain.launch.local import run_in_process

    _, _, whole = local_spec(cfg_dict, root / "whole")
    run_in_process(whole)
    _, _, again = local_spec(cfg_dict, root / "again")
    shutil.copytree(root / "whole" / "checkpoints" / f"step-{step}", root / "again" / "checkpoints" / f"step-{step}")
    run_in_process(again)
    assert f"resume: from step-{step}" in (root / "again" / "logs" / "main.log").read_text()
    a, b = (load_file(root / run / "final" / weights) for run in ("whole", "again"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return root / "whole", root / "again"


def cli_train(cfg: dict, root: Path, name: str, workers: int = 1) -> Path:
    """``scaletrain train`` on ``cfg`` as a user runs it (the local launcher for 1 worker, torchrun for more; no
    Ray), into ``root``/runs/``name``; asserts it succeeded and returns the run directory. The command runs in this
    process (tests/cli.py): one worker trains here, torchrun's agent and workers are processes of their own."""
    from tests.cli import run_cli

    cfg = {**cfg, "scaling": {**cfg.get("scaling", {}), "num_workers": workers,
                              "launcher": "torchrun" if workers > 1 else "local"},
           "output": {"output_dir": str(root / "runs"), "run_name": name}}
    out = run_cli("train", "--no-progress", write_config(root / f"{name}.yaml", cfg),
                  env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "runs" / name


def train_losses(run_dir: Path) -> list[float]:
    from scaletrain.metrics.records import read_jsonl

    return [r["train/loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


# Credentials of the test's S3 server: a secret shape the redactor must recognise, and that no file may hold.
S3_KEY_ID, S3_SECRET = "AKIASCALETRAINTEST01", "st3SecretQ9xWv2LmZp8RtYk4NbHc7JdFg6Es1Au"


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server on loopback (moto in server mode), its credentials in this process's environment
    (so an embedded Ray's workers and subprocesses inherit them); yields its endpoint URL. Stopped after."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server._server.server_address
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID=S3_KEY_ID, AWS_SECRET_ACCESS_KEY=S3_SECRET, AWS_DEFAULT_REGION="us-east-1")
    yield f"http://{host}:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def lora_run_dir(root: Path, lora_std: float):
    """A run directory as a LoRA run leaves it, without training: a tiny Llama base saved in bf16 with its tokenizer
    (a directory), final/ with a q/v adapter whose B is drawn from N(0, lora_std) (seeded, so it changes answers) and
    the tokenizer, config.resolved.yaml. Returns (base, run, the peft model in fp32)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    base, run = root / "base", root / "run"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128)).to(torch.bfloat16).save_pretrained(base)
    tok = tiny_llama_tokenizer()
    tok.save_pretrained(base)
    adapted = get_peft_model(LlamaForCausalLM.from_pretrained(base, dtype=torch.float32),
                             LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    for name, param in adapted.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=lora_std)
    (run / "final").mkdir(parents=True)
    adapted.save_pretrained(run / "final")
    tok.save_pretrained(run / "final")
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"model": {"name_or_path": str(base), "task": "causal-lm", "finetuning_type": "lora"}}))
    return base, run, adapted


# Set in the environment of a Ray head a test starts apart from the suite's shared Ray (a `ray_head` test, a
# simulated cluster): the head's processes, and the Ray Train workers its raylet starts, inherit it; the suite's
# orphan check (no_orphans) leaves them alone while they run beside it under make test.
OWN_HEAD = "SCALETRAIN_TEST_OWN_HEAD"
# =1: the suite's shared Ray starts its workers the plain way, not forked pre-imported (tests/integration/conftest.py)
PLAIN_WORKERS = "SCALETRAIN_TEST_PLAIN_WORKERS"


def run_own_group(args: list[str], timeout: float, env: dict | None = None):
    """``subprocess.run(args, capture_output=True, text=True)`` for a harness that starts a Ray cluster of its own
    (raylets, GCS, training workers): in a session and a TMPDIR of its own, marked OWN_HEAD. Ray keeps its sessions
    and the address file a ray.init() without an address looks for (ray_current_cluster) under TMPDIR, so no other
    test's Ray joins this cluster, and it can run beside the shared Ray. What is left of its session when it ends,
    or when the timeout passes (a failure with the output so far), is killed: nothing runs on behind it."""
    import shutil
    import subprocess
    import tempfile

    private = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    env = {**(os.environ if env is None else env), "TMPDIR": private, OWN_HEAD: "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{args[1] if len(args) > 1 else args[0]}: still running after {timeout:.0f} s; its session "
                    f"was killed\n{out[-2000:]}\n{err[-3000:]}")
    finally:
        _kill_session(proc.pid)
        shutil.rmtree(private, ignore_errors=True)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (Ray's own start in process groups of their own, in the session),
    and what its leader started in sessions of their own while it runs (a fork server: two_nodes.py)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(sid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                p.kill()
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                p.kill()
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass


def make_bucket(endpoint: str, name: str) -> str:
    import fsspec

    fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True).mkdir(name)
    return name


# A start-up phase line (launch/phases.py): "  1.1 s config checked: ...". They may come before an error line.
PHASE_LINE = re.compile(r"^\s*\d+\.\d s \S")


def without_phases(text: str) -> list[str]:
    """The non-empty lines of a command's output other than its start-up phase lines."""
    return [ln for ln in text.splitlines() if ln.strip() and not PHASE_LINE.match(ln)]


def free_port() -> int:
    """A TCP port free on loopback now (for a process group's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny_llama(d: Path, hidden: int = 256, intermediate: int = 512) -> Path:
    """A tiny Llama in bf16 (as the real checkpoints) whose linear weights are NF4-sized (multiples of 16384 values:
    QLoRA's tests) at the default widths, and the tiny tokenizer, saved in ``d``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=intermediate, max_position_embeddings=512,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(d)
    tiny_llama_tokenizer().save_pretrained(d)
    return d


def save_tiny_qwen3_moe(d: Path, dtype=None) -> Path:
    """A tiny Qwen3-MoE (4 experts, top-2, router_aux_loss_coef 0.01) and the tiny tokenizer saved in ``d``, in
    ``dtype`` (e.g. bf16, as the real checkpoints) or fp32."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                            num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01)
    model = Qwen3MoeForCausalLM(config)
    (model.to(dtype) if dtype is not None else model).save_pretrained(d)
    tiny_llama_tokenizer().save_pretrained(d)
    return d


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N`` (make test): the tests that start or join a Ray cluster run one after another on one
    worker, so a ``ray.init()`` never finds another test's ``ray start --head`` cluster (it looks for a running one
    first) and the shared local Ray starts once; the other tests (the in-process and pure tiers, torchrun and object
    storage without Ray) run on the other workers meanwhile, a module whose tests share a module-scoped fixture on
    one of them."""
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif not item.get_closest_marker("xdist_group") and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _shares_a_module_fixture(item) -> bool:
    """Whether ``item`` uses a module-scoped fixture (a head of its own, a finished run, a pool of ranks): its
    module's tests then keep to one pytest worker, which builds the fixture once. Spread over the workers, each
    built its own (measured: the token head started twice under -n 2, the GPU check script ran twice under -n 3)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


@pytest.fixture(scope="session", autouse=True)
def ends_with_the_session():
    """What the session starts (fork servers, Ray, torchrun, drivers) ends with it, even when pytest is SIGKILLed
    (a timeout, a closed terminal): the drivers' own mark and reaper (launch/orphans.py), this process the driver."""
    from scaletrain.launch.orphans import mark_and_watch

    mark_and_watch()
    yield


@pytest.fixture(scope="session", autouse=True)
def torchrun_forkserver(request, tmp_path_factory, ends_with_the_session):
    """torchrun's workers in this session are forked pre-imported from one fork server (SCALETRAIN_FORKSERVER;
    launch/warm/forkserver.py, as on a node where `scaletrain up` runs one) instead of each importing torch,
    transformers and the loop again (~5 CPU-seconds a worker here). torchrun's agent and its restarts, exit codes and
    signals are the same; the server imports under the environment the suite's CPU torchrun workers get (this one,
    scaletrain's worker defaults, glibc's allocator settings for CPU workers), so theirs match it, and a worker
    whose environment differs (a test's own variable) starts plain, the server's log says why and a warning at the
    end counts them. Only where tests that start them were selected (integration or slow ones); PLAIN_WORKERS=1
    turns it off."""
    from scaletrain import envvars

    started = any(f"tests{os.sep}integration" in str(item.path) or item.get_closest_marker("slow")
                  for item in request.session.items)  # (make test-fast starts no torchrun: no server)
    if not started or os.environ.get(PLAIN_WORKERS) == "1" or os.environ.get(envvars.SCALETRAIN_FORKSERVER):
        yield None
        return
    import signal
    import warnings

    from scaletrain.launch.warm.cluster import start_forkserver

    d = tmp_path_factory.mktemp("torchrun-forkserver")
    log = d / "server.log"
    env = {**envvars.WORKER_ENV_DEFAULTS, **envvars.snapshot(), **envvars.CPU_WORKER_ENV_DEFAULTS}
    sock, pgid = start_forkserver(str(d / "s.sock"), log, env=env)
    if not sock:
        warnings.warn(f"the torchrun fork server did not come up (see {log}): workers start plain", stacklevel=2)
        yield None
        return
    os.environ[envvars.SCALETRAIN_FORKSERVER] = sock
    yield sock
    os.environ.pop(envvars.SCALETRAIN_FORKSERVER, None)
    os.killpg(pgid, signal.SIGKILL)
    lines = log.read_text(errors="replace").splitlines()
    plain = sorted({ln for ln in lines if ln.startswith("exec:")})
    if plain:
        warnings.warn(f"the torchrun fork server forked {sum(ln.startswith('forked ') for ln in lines)} worker(s) "
                      f"and {sum(ln.startswith('exec:') for ln in lines)} started plain ({'; '.join(plain)[:500]})",
                      stacklevel=2)

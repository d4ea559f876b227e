"""End-to-end runs on a shared local Ray with gloo: 1 and 2 workers, DDP and FSDP, full and LoRA."""

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from scaletrain.config import validate
from scaletrain.errors import LaunchError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl
from tests.conftest import train_losses

# the shared Ray up from the first test on: scaling.launcher auto runs on it, as the tests mean (without it, 2
# local workers would run under torchrun)
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]


def _run(cfg_dict, tmp_path, name):
    cfg_dict = {**cfg_dict, "output": {**cfg_dict.get("output", {}), "output_dir": str(tmp_path / "runs"),
                                       "run_name": name}}
    return run_job(validate(cfg_dict), tmp_path / f"{name}.yaml", show_progress=False)


def _rank_evals(run_dir: Path, world: int) -> list[dict]:
    out = []
    for r in range(world):
        text = (run_dir / "logs" / f"worker-{r}.log").read_text()
        out.append(json.loads(re.findall(r"eval step \d+: (\{.*\})", text)[-1]))
    return out


def _check_run_dir(run_dir: Path, world: int, total_steps: int):
    cfg = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    assert cfg["scaling"]["num_workers"] == world
    main_log = (run_dir / "logs" / "main.log").read_text()
    for event in ("[driver] start", "workers up", "eval", "finish"):
        assert event in main_log, event
    assert sorted(p.name for p in (run_dir / "logs").glob("worker-*.log")) == [f"worker-{r}.log" for r in range(world)]
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert train[-1]["step"] == total_steps
    for key in ("train/loss", "train/lr", "throughput/samples_per_s", "throughput/tokens_per_s", "time/step_s",
                "time/data_wait_s", "memory/rss_gib", "system/cpu_pct", "epoch"):
        assert all(key in r for r in train), key
    assert all(r["throughput/samples_per_s"] > 0 and r["scaling/workers"] == world for r in train)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == world and summary["steps"] == total_steps
    assert summary["train_time_s"] > 0 and summary["eval_time_s"] > 0 and summary["final"]["eval/loss"] > 0
    parts = [v for k, v in summary.items() if k.startswith("goodput/") and k.endswith("_s") and k != "goodput/wall_s"]
    assert len(parts) == 11 and summary["goodput/interruptions"] == 0  # every category, adding up to the wall time
    assert sum(parts) == pytest.approx(summary["goodput/wall_s"], rel=0.01) and summary["goodput/other_s"] >= 0
    assert summary["goodput/productive_s"] > 0 and summary["goodput/cluster_start_s"] > 0
    return summary


@pytest.mark.parametrize("workers", [1, 2])
def test_classification_full_ddp(classify_cfg, tmp_path, workers, no_orphans):
    classify_cfg["train"].update(max_steps=80, logging_steps=10, eval_steps=40)
    classify_cfg["scaling"]["num_workers"] = workers
    classify_cfg["checkpoint"] = {"save_steps": 40, "save_total_limit": 1}
    result = _run(classify_cfg, tmp_path, f"cls{workers}")
    summary = _check_run_dir(result.run_dir, workers, 80)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0] * 0.7
    assert summary["final"]["eval/accuracy"] > 0.75
    evals = _rank_evals(result.run_dir, workers)
    assert all(e == evals[0] for e in evals)  # all-reduced: bit-identical on every rank
    assert evals[0]["eval/loss"] == summary["final"]["eval/loss"]
    assert [p.name for p in (result.run_dir / "checkpoints").iterdir()] == ["step-80"]  # keep 1
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(result.run_dir / "final")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_two_worker_runs_are_reproducible(classify_cfg, tmp_path, no_orphans):
    classify_cfg["train"].update(max_steps=10, logging_steps=2)
    classify_cfg["scaling"]["num_workers"] = 2
    a = _run(classify_cfg, tmp_path, "a")
    b = _run(classify_cfg, tmp_path, "b")
    assert train_losses(a.run_dir) == train_losses(b.run_dir) and len(train_losses(a.run_dir)) == 5


@pytest.mark.parametrize("workers", [1, 2])
def test_causal_lm_lora_ddp(demo_dir, tmp_path, workers, no_orphans):
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora"},
        "data": {"train_file": str(demo_dir / "alpaca.json"), "eval_ratio": 0.1, "max_length": 48},
        "train": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "learning_rate": 5e-3,
                  "max_steps": 20, "logging_steps": 5},
        "scaling": {"num_workers": workers},
    }
    result = _run(cfg, tmp_path, f"sft{workers}")
    summary = _check_run_dir(result.run_dir, workers, 20)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0]
    assert summary["global_batch_size"] == 8 * workers and "eval/perplexity" in summary["final"]
    evals = _rank_evals(result.run_dir, workers)
    assert all(e == evals[0] for e in evals)
    assert (result.run_dir / "final" / "adapter_model.safetensors").is_file()


def test_lora_sft_on_sharegpt_chat_data_with_two_workers(demo_dir, tmp_path, no_orphans):
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora"},
        "data": {"train_file": str(demo_dir / "chat.jsonl"), "formatting": "sharegpt", "template": "auto",
                 "cutoff_len": 128, "eval_ratio": 0.1},
        "train": {"per_device_train_batch_size": 4, "learning_rate": 5e-3, "max_steps": 24, "logging_steps": 4},
        "scaling": {"num_workers": 2},
    }
    result = _run(cfg, tmp_path, "chat")
    _check_run_dir(result.run_dir, 2, 24)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0] - 0.2, losses  # 6.07 -> 5.56 when measured
    source = json.loads((result.run_dir / "data" / "source.json").read_text())
    assert source["train_examples"] == 216 and source["eval_examples"] == 24 and not source["skipped"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(result.run_dir / "final"))
    assert "<|im_start|>" in tok.chat_template  # final/ keeps the template the run trained with
    cfg["train"].update(max_steps=4)  # no data key changes: the same tokens, from the cache
    again = _run(cfg, tmp_path, "chat-again")
    assert "data: cache hit" in (again.run_dir / "logs" / "main.log").read_text()


def test_lora_on_a_glaive_style_tool_dataset_with_two_workers(tmp_path, no_orphans):
    """LLaMA-Factory's tool-calling shape (sharegpt function_call/observation turns, a tools column) trains with the
    tools declared in every prompt, in Mistral v0.3's own format (the most compact: the tiny model has 512
    positions), and the trained tokens are the calls and replies."""
    import datasets
    from transformers import AutoTokenizer

    cities = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Quito", "Delhi", "Tokyo"]
    tools = json.dumps([{"name": "get_weather", "description": "Weather of a city.",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    rows = [{"conversations": [
        {"from": "human", "value": f"Weather in {c}?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": c}})},
        {"from": "observation", "value": json.dumps({"temp_c": 10 + i})},
        {"from": "gpt", "value": f"It is {10 + i} C in {c}."}], "tools": tools}
        for i, c in enumerate(cities * 4)]
    lf = tmp_path / "lf"
    lf.mkdir()
    (lf / "glaive.json").write_text(json.dumps(rows))
    entry = {"file_name": "glaive.json", "formatting": "sharegpt",
             "columns": {"messages": "conversations", "tools": "tools"}}
    (lf / "dataset_info.json").write_text(json.dumps({"glaive_demo": entry}))
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora"},
        "data": {"dataset_dir": str(lf), "dataset": "glaive_demo", "template": "mistral", "cutoff_len": 512,
                 "eval_ratio": 0.125},
        "train": {"per_device_train_batch_size": 2, "learning_rate": 5e-3, "max_steps": 4, "logging_steps": 2},
        "scaling": {"num_workers": 2},
    }
    result = _run(cfg, tmp_path, "tools")
    _check_run_dir(result.run_dir, 2, 4)
    tok = AutoTokenizer.from_pretrained(str(result.run_dir / "final"))
    source = json.loads((result.run_dir / "data" / "source.json").read_text())
    train = datasets.load_from_disk(source["train"])
    assert len(train) == 28 and not source["skipped"]
    for ex in train.select(range(4)):
        prompt = tok.decode(ex["input_ids"])
        assert "[AVAILABLE_TOOLS]" in prompt and '"name": "get_weather"' in prompt and "[TOOL_RESULTS]" in prompt
        trained = tok.decode([t for t, y in zip(ex["input_ids"], ex["labels"]) if y != -100])
        assert trained.startswith('[TOOL_CALLS] [{"name": "get_weather"') and "temp_c" not in trained
        assert trained.endswith(" C in " + prompt.split("Weather in ")[1].split("?")[0] + ".</s>")
    assert "[TOOL_CALLS]" in tok.chat_template  # final/ keeps the template the run trained with


@pytest.mark.parametrize("workers,lora", [(1, False), (2, False), (2, True)])
def test_fsdp(classify_cfg, demo_dir, tmp_path, workers, lora, no_orphans):
    classify_cfg["train"].update(strategy="fsdp", max_steps=80, logging_steps=10)
    classify_cfg["scaling"]["num_workers"] = workers
    classify_cfg["checkpoint"] = {"save_steps": 80}
    if lora:
        classify_cfg["model"].update(finetuning_type="lora", lora_target=["query", "value"])
        classify_cfg["train"]["learning_rate"] = 1e-2  # LoRA on a random-init model needs a larger step
    result = _run(classify_cfg, tmp_path, f"fsdp{workers}{lora}")
    _check_run_dir(result.run_dir, workers, 80)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0]
    evals = _rank_evals(result.run_dir, workers)
    assert all(e == evals[0] for e in evals)
    state = result.run_dir / "checkpoints" / "step-80" / "state"
    # sharded: every rank wrote its own file (nothing gathered onto rank 0); the metadata holds the full shapes
    assert sorted(p.name for p in state.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(workers)]
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    meta = FileSystemReader(str(state)).read_metadata().state_dict_metadata
    model_keys = [k for k in meta if k.startswith("model.")]
    if lora:  # trainable parameters only, and the adapters moved away from their zero init
        assert model_keys and all("lora" in k or "classifier" in k for k in model_keys)
        dcp_to_torch_save(str(state), str(tmp_path / "full.pt"))
        full = torch.load(tmp_path / "full.pt", weights_only=True)["model"]
        assert any(v.abs().sum() > 0 for k, v in full.items() if "lora_B" in k)
    else:
        emb = [meta[k].size for k in model_keys if k.endswith("word_embeddings.weight")]
        assert tuple(emb[0]) == (30522, 64)


def test_too_many_workers_is_a_clear_error_and_no_run_dir(classify_cfg, tmp_path, ray_local):
    classify_cfg["scaling"]["num_workers"] = 3
    with pytest.raises(LaunchError, match=r"scaling.num_workers=3 needs 3 CPUs .* the cluster has 2"):
        _run(classify_cfg, tmp_path, "big")
    assert not (tmp_path / "runs" / "big").exists()


def test_nccl_without_gpu_is_a_clear_error(classify_cfg, tmp_path, ray_local):
    classify_cfg["comm"] = {"backend": "nccl"}
    with pytest.raises(LaunchError, match="comm.backend=nccl needs a GPU.*set comm.backend=gloo or auto"):
        _run(classify_cfg, tmp_path, "nccl")

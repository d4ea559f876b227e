"""The worker loop on 2 workers with chat and tool data and under FSDP, launched by torchrun (what the loop does does
not depend on the launcher, and a torchrun job starts in about half a Ray one's time; these run beside the Ray
tests under make test's two pytest workers). Each run leaves what a Ray one does (train_checks.check_run_dir)."""

import json

import pytest
import torch

from tests.conftest import train_losses
from tests.integration import train_checks
from tests.integration.train_checks import check_run_dir, rank_evals

pytestmark = pytest.mark.slow


def run(cfg_dict, tmp_path, name):
    return train_checks.run(cfg_dict, tmp_path, name, launcher="torchrun")


def test_lora_sft_on_sharegpt_chat_data_with_two_workers(demo_dir, tmp_path):
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora"},
        "data": {"train_file": str(demo_dir / "chat.jsonl"), "formatting": "sharegpt", "template": "auto",
                 "cutoff_len": 128, "eval_ratio": 0.1},
        "train": {"per_device_train_batch_size": 4, "learning_rate": 5e-3, "max_steps": 24, "logging_steps": 4},
        "scaling": {"num_workers": 2},
    }
    result = run(cfg, tmp_path, "chat")
    check_run_dir(result.run_dir, 2, 24)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0] - 0.2, losses  # 6.07 -> 5.56 when measured
    source = json.loads((result.run_dir / "data" / "source.json").read_text())
    assert source["train_examples"] == 216 and source["eval_examples"] == 24 and not source["skipped"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(result.run_dir / "final"))
    assert "<|im_start|>" in tok.chat_template  # final/ keeps the template the run trained with
    cfg["train"].update(max_steps=4)  # no data key changes: the same tokens, from the cache
    again = run(cfg, tmp_path, "chat-again")
    assert "data: cache hit" in (again.run_dir / "logs" / "main.log").read_text()


def test_lora_on_a_glaive_style_tool_dataset_with_two_workers(tmp_path):
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
    result = run(cfg, tmp_path, "tools")
    check_run_dir(result.run_dir, 2, 4)
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


@pytest.mark.parametrize("lora", [False, True])
def test_fsdp(classify_cfg, tmp_path, lora):
    """2 workers (FSDP on a process group of one: tests/loop/test_local_launcher.py)."""
    workers = 2
    classify_cfg["train"].update(strategy="fsdp", max_steps=80, logging_steps=10)
    classify_cfg["scaling"]["num_workers"] = workers
    classify_cfg["checkpoint"] = {"save_steps": 80}
    if lora:
        classify_cfg["model"].update(finetuning_type="lora", lora_target=["query", "value"])
        classify_cfg["train"]["learning_rate"] = 1e-2  # LoRA on a random-init model needs a larger step
    result = run(classify_cfg, tmp_path, f"fsdp{workers}{lora}")
    check_run_dir(result.run_dir, workers, 80)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0]
    evals = rank_evals(result.run_dir, workers)
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

"""#76: LLaMA-Factory v1's files as its users bring them: every YAML of its examples/v1 imports (a row for every
key) or refuses in one line naming the key when its job cannot run here, writing nothing; its dataset spec files
are read wherever a data set is named; a v1 job whose data and model are made local trains (tests/fixtures/
llamafactory/v1, from LLaMA-Factory's repository: SOURCES.md)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from scaletrain.config import validate
from scaletrain.config.lf_v1 import from_v1, looks_like_v1
from scaletrain.errors import DataError
from tests.cli import run_cli

V1 = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory" / "v1"
REFUSED = {  # the files whose job cannot run here, and the key the one line names
    "train_freeze_sft.yaml": "peft_config=freeze: freeze fine-tuning (the last 2 layers) is not in scaletrain",
    "train_full_muon.yaml": "optim_config=muon: the muon optimizer is not in scaletrain",
    "export_lora.yaml": "peft_config=lora: an export file",
}


@pytest.fixture
def lf_repo(tmp_path):
    """LLaMA-Factory's layout: examples/v1/... and data/ with the spec files and the data they name."""
    (tmp_path / "examples" / "v1").mkdir(parents=True)
    for f in (V1 / "examples").glob("*.yaml"):
        shutil.copy(f, tmp_path / "examples" / "v1" / f.name)
    data = tmp_path / "data"
    data.mkdir()
    for name in ("v1_sft_demo.yaml", "v1_dpo_demo.yaml"):
        shutil.copy(V1 / name, data / name)
    rows = [json.loads(line) for line in (V1 / "v1_sft_demo.jsonl").read_text().splitlines()]
    alpaca = [{"instruction": r["messages"][0]["content"][0]["value"], "input": "",
               "output": r["messages"][1]["content"][0]["value"].replace("{{name}}", "Tiny").replace("{{author}}",
                                                                                                   "us")} for r in rows]
    (data / "identity.json").write_text(json.dumps(alpaca))
    (data / "alpaca_en_demo.json").write_text(json.dumps(alpaca * 100))
    return tmp_path


@pytest.mark.slow  # 17 imports through the CLI (~10 CPU-seconds): make test, not make test-fast
@pytest.mark.parametrize("name", sorted(p.name for p in (V1 / "examples").glob("*.yaml")))
def test_every_v1_example_imports_or_refuses_in_one_line(name, lf_repo, monkeypatch):
    monkeypatch.chdir(lf_repo)
    path = f"examples/v1/{name}"
    raw = yaml.safe_load((lf_repo / path).read_text())
    assert looks_like_v1(raw)
    out = run_cli("import", "llamafactory", path, "-o", "imported.yaml")
    if name in REFUSED:
        assert out.returncode == 2 and REFUSED[name] in out.stderr.splitlines()[-1], out.stderr[-500:]
        assert "no config written" in out.stderr and not (lf_repo / "imported.yaml").exists()
        return
    assert out.returncode == 0, out.stderr[-800:]
    cfg = validate(yaml.safe_load((lf_repo / "imported.yaml").read_text()))
    _, rows = from_v1(raw, path)
    assert {r.key.split(".")[0] for r in rows} >= set(raw)  # every key of the file has a row
    assert cfg.model.name_or_path == raw["model"] and cfg.data.max_length == raw["cutoff_len"]
    assert cfg.train.per_device_train_batch_size == raw["micro_batch_size"] and cfg.train.strategy == "fsdp"
    if "peft_config" in raw:
        assert (cfg.model.finetuning_type, cfg.model.lora_rank, cfg.model.lora_target) == ("lora", 16, "all-linear")
    if raw.get("quant_config"):
        assert cfg.model.quantization_bit == 4
    if name == "train_lora_dpo.yaml":  # its spec's pair converter: preference tuning (its hub path said on training)
        assert cfg.train.stage == "dpo"
    if name == "train_full_ulysses_cp.yaml":
        assert (cfg.scaling.context_parallel, cfg.scaling.context_parallel_method, cfg.train.bf16) == (2, "ulysses",
                                                                                                    False)
    strategy = raw.get("batching_strategy", "normal")
    assert cfg.data.packing == ("padding_free" in strategy)
    if strategy in ("normal", "dynamic_batching"):  # shuffled and padded, or scaletrain's length-balanced sampler
        assert cfg.data.balance_ranks == (strategy == "dynamic_batching")


def test_a_dataset_spec_file_is_read_with_its_converters_and_sizes(lf_repo, monkeypatch):
    from scaletrain.data.spec import read_spec

    monkeypatch.chdir(lf_repo)
    entries = read_spec("data/v1_sft_demo.yaml", "data.train_file")
    assert [(e.name, e.formatting, e.size) for e in entries] == [("identity", "alpaca", None),
                                                                  ("alpaca_en_demo", "alpaca", 500)]
    spec = lf_repo / "data" / "bad.yaml"
    for entry, said in (({"path": "HuggingFaceH4/ultrachat_200k"}, "is a hub dataset; scaletrain never downloads"),
                        ({"path": "data/identity.json", "converter": "xml"}, "converter 'xml' is not one"),
                        ({"path": "data/identity.json", "split": "test"}, "split test of a local file"),
                        ({"path": "data/identity.json", "size": 0}, "size 0"),
                        ({"path": "data/missing.json"}, "data/missing.json not found")):
        spec.write_text(yaml.safe_dump({"d": entry}))
        with pytest.raises(DataError, match="data.train_file=data/bad.yaml: dataset d") as e:
            read_spec("data/bad.yaml", "data.train_file")
        assert said in str(e.value), str(e.value)


@pytest.mark.loop
@pytest.mark.slow  # a whole (tiny) run: make test, not make test-fast
def test_an_imported_v1_lora_job_trains_on_its_spec_file_with_a_tiny_model(lf_repo, monkeypatch):
    from scaletrain.metrics.records import read_jsonl

    monkeypatch.chdir(lf_repo)
    assert run_cli("import", "llamafactory", "examples/v1/train_lora_sft.yaml", "-o", "lora.yaml").returncode == 0
    out = run_cli("train", "lora.yaml", "model.name_or_path=builtin:tiny-llama", "train.max_steps=2",
                  "train.bf16=false", "train.strategy=ddp", "data.max_length=256", "--no-progress")
    assert out.returncode == 0, out.stderr[-1500:]
    run = lf_repo / "outputs" / "test_lora"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"][-1] == 2
    said = " ".join(out.stderr.split())
    assert "508 train examples" in said, said[-2000:]  # identity's 8 rows and alpaca_en_demo's size: 500 of its 800

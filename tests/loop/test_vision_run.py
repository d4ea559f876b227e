"""#62 end to end: LLaMA-Factory's mllm_demo shape (a dataset_info.json entry, <image> placeholders, an images
column) fine-tunes a tiny Qwen2-VL; on 2 workers, where in each step one rank's micro-batch holds the only image
and the other's none, DDP and FSDP, padded and packed, train the same losses as 1 worker (1e-6), with no rank left
waiting (the text-only rank runs the tower on a stand-in image, data/collate.py StandIn)."""

import json

import pytest

from scaletrain.rundir import RunDir
from tests.cli import run_cli
from tests.conftest import cli_train, train_losses
from tests.vlm import mllm_demo, save_tiny

pytestmark = pytest.mark.loop


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory):
    return save_tiny("qwen2_vl", tmp_path_factory.mktemp("qwen2-vl"))


def _cfg(model, data, **train):
    # the tower trains too: a rank that skipped it would leave DDP's reduction of its gradients waiting
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "finetuning_type": "full",
                      "freeze_vision_tower": False, "freeze_multi_modal_projector": False},
            "data": {"dataset_dir": str(data), "dataset": ["mllm_demo"], "max_length": 96, "eval_ratio": 0,
                     "balance_ranks": False},
            "train": {"per_device_train_batch_size": 2, "max_steps": 4, "learning_rate": 1e-3, "logging_steps": 1,
                      **train}}


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.parametrize("packing", [False, True])
def test_a_rank_without_an_image_trains_what_one_worker_trains(qwen2_vl, tmp_path, packing):
    """Padded: DDP and FSDP on 2 workers against one 1-worker run; packed: DDP."""
    data = mllm_demo(tmp_path / "data", n=4, text_only_every=4)
    rows = json.loads((data / "mllm_demo.json").read_text())
    for row in rows[1:]:  # one image in the whole set: every step has a rank without one
        row["messages"][0]["content"] = row["messages"][0]["content"].replace("<image>", "")
        row["images"] = []
    (data / "mllm_demo.json").write_text(json.dumps(rows))

    def run(workers: int, strategy: str):
        cfg = _cfg(qwen2_vl, data, strategy=strategy, per_device_train_batch_size=2 // workers)
        cfg["data"]["packing"] = packing  # packed: rows of up to 96 tokens, one ~60-token example each
        cfg["data"]["loader_workers"] = workers - 1  # 2 workers: their pixels made in a data-loading process (#73)
        return cli_train(cfg, tmp_path, f"w{workers}-{strategy}", workers)

    one = train_losses(run(1, "ddp"))
    assert len(one) == 4
    for strategy in ("ddp",) if packing else ("ddp", "fsdp"):
        two = run(2, strategy)
        assert train_losses(two) == pytest.approx(one, abs=1e-6), strategy
        said = (two / RunDir.MAIN_LOG).read_text()  # what the loaders give against a step's images (#73)
        assert "images: the loaders make" in said and "data.loader_workers=1 per rank" in said, said[-2000:]
        records = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
        assert all(r["data/images_skipped"] == 0 for r in records if r.get("kind") == "train")
        ready = [r["ranks/ready_s"] for r in records if r.get("kind") == "train"]
        # no rank waits on another at the gradient sync: the ranks reach it within a second of each other
        assert len(ready) == 4 and all(max(r) - min(r) < 1.0 for r in ready), (strategy, ready)


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_lora_run_exports_its_processor_and_chats_about_an_image(qwen2_vl, tmp_path):
    """After training: final/ and the export carry the processor's files and the trained chat template; `chat RUN
    --image FILE --prompt TEXT` answers, and the exported model reads the image through them; `eval --data` takes
    rows with images; `serve --print vllm` says how many images a prompt may have and their pixel bounds."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    from scaletrain.after.export import export_run
    from scaletrain.data.vision import prompt_inputs
    from scaletrain.model.processor import image_text
    from tests.unit.test_export import _within_one_ulp
    from tests.vlm import image

    cfg = _cfg(qwen2_vl, mllm_demo(tmp_path / "data", n=4), max_steps=2)
    cfg["model"].update({"finetuning_type": "lora", "lora_rank": 4})
    run = cli_train(cfg, tmp_path, "lora")
    done = export_run(run)
    for where in (run / "final", done.path):
        assert (where / "preprocessor_config.json").is_file() and (where / "chat_template.jinja").is_file()
    image(64, 48, seed=5).save(tmp_path / "cat.png")
    out = run_cli("chat", run, "--image", tmp_path / "cat.png", "--prompt", "What is this?", "--max-new-tokens", "4")
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    tok = AutoTokenizer.from_pretrained(str(done.path))
    model = AutoModelForImageTextToText.from_pretrained(str(done.path), dtype=torch.float32)
    from peft import PeftModel  # the export's merge is peft's (its language model's adapted weights)

    reference = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(
        str(qwen2_vl), dtype=torch.float32), str(run / "final")).merge_and_unload().state_dict()
    mine = model.state_dict()  # the bf16 export's weights: peft's fp32 merge rounded once, within one ulp
    assert done.dtype == "bf16" and done.merged > 0
    assert all(_within_one_ulp(mine[k].to(torch.bfloat16), reference[k]) for k in reference)
    reader = image_text(str(done.path), AutoConfig.from_pretrained(str(done.path)), tok)
    inputs = prompt_inputs([{"role": "user", "content": "<image>What is this?"}], tok, reader,
                           [image(64, 48, seed=5)])
    with torch.no_grad():
        new = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert new.shape[1] > inputs["input_ids"].shape[1]
    from scaletrain.after.gen_eval import generation_eval

    results, _ = generation_eval(run, "mllm_demo", max_new_tokens=3)  # its dataset_info entry: rows with images
    assert results["scaletrain"]["examples"] == 4 and "<|image_pad|>" in results["predictions"][0]["prompt"]
    from scaletrain.after.serving import serve_plan

    plan = serve_plan(run, "vllm")
    assert """--limit-mm-per-prompt '{"image": 2}'""" in plan.commands[0], plan
    assert """--mm-processor-kwargs '{"max_pixels": 589824, "min_pixels": 1024}'""" in plan.commands[0], plan
    missing = run_cli("chat", run, "--image", tmp_path / "nope.png", "--prompt", "Hi")
    assert missing.returncode != 0 and "nope.png does not exist" in missing.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("example,data", [("qwen3vl_lora_sft.yaml", "llamafactory_data"),
                                          ("qwen3vl_lora_dpo.yaml", "rlhf_v")])
@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_llamafactorys_vision_language_examples_train_as_imported(tmp_path, example, data):
    """LLaMA-Factory's examples/train_lora/qwen3vl_lora_{sft,dpo}.yaml, imported as they are (a tiny Qwen3-VL in
    the model's place, LF's data shapes in its dataset_dir, two steps), train: the SFT loss falls, DPO's starts at
    log 2 (the policy is its reference) and both leave an adapter."""
    from pathlib import Path

    import yaml

    import tests.vlm as vlm
    from scaletrain.config.importers import from_llamafactory

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory"
    lf = yaml.safe_load((fixtures / example).read_text())
    model = save_tiny("qwen3_vl", tmp_path / "qwen3-vl")
    cfg, _ = from_llamafactory({**lf, "model_name_or_path": str(model), "cutoff_len": 256, "bf16": False,
                                "dataset_dir": str(getattr(vlm, data)(tmp_path / "data", n=8))})
    cfg["train"].update({"max_steps": 3, "logging_steps": 1, "gradient_accumulation_steps": 1,
                         "per_device_train_batch_size": 4, "learning_rate": 5e-3})
    cfg.pop("output", None)
    run = cli_train(cfg, tmp_path, "imported")
    losses = train_losses(run)
    assert (run / "final" / "adapter_model.safetensors").is_file() and len(losses) == 3
    if example.endswith("dpo.yaml"):
        assert losses[0] == pytest.approx(0.6931, abs=1e-3)
    else:
        assert losses[-1] < losses[0]


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_an_image_damaged_after_the_data_step_is_skipped_on_two_workers_without_a_hang(qwen2_vl, tmp_path):
    """An image whose file is cut short (its header still read, its pixels not): the data step sizes it from the
    header, a data-loading worker cannot decode it, its record is skipped and counted, and the 2-worker run ends."""
    data = mllm_demo(tmp_path / "data", n=8)
    rows = json.loads((data / "mllm_demo.json").read_text())
    victim = data / rows[0]["images"][0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size * 2 // 3])
    cfg = _cfg(qwen2_vl, data, strategy="ddp", per_device_train_batch_size=2, max_steps=4)
    cfg["data"]["loader_workers"] = 1
    run = cli_train(cfg, tmp_path, "damaged", 2)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["data/images_skipped"] for r in records if r.get("kind") == "train") >= 1
    logs = "".join(p.read_text() for p in (run / "logs").glob("*.log"))
    assert str(victim) in logs and "its record is skipped" in logs, logs[-3000:]


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_gemma3_packed_trains_on_two_workers_what_one_trains(tmp_path):
    """#73: Gemma 3 packed end to end (its rows' masks built in the step, vision.packed_inputs), the pixels made in
    a data-loading process on 2 workers: the same losses as 1 worker (1e-6), and an eval on packed rows."""
    model = save_tiny("gemma3", tmp_path / "gemma3")
    data = mllm_demo(tmp_path / "data", n=8)

    def run(workers: int):
        cfg = _cfg(model, data, strategy="ddp", per_device_train_batch_size=2 // workers, max_steps=3)
        cfg["data"].update(packing=True, max_length=128, loader_workers=workers - 1, eval_ratio=0.25,
                           pack_eval=True)
        cfg["train"].update(eval_steps=3)
        return cli_train(cfg, tmp_path, f"g3-w{workers}", workers)

    one, two = run(1), run(2)
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-6)
    evals = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "eval" for r in evals)


@pytest.mark.slow  # two whole runs: make test, not make test-fast
def test_a_vision_run_resumed_mid_epoch_replays_the_same_images(qwen2_vl, tmp_path):
    """#73: a run killed after its step-2 checkpoint, mid-epoch, resumes on the same records (their images made
    again from the same references: the pixels are a function of the row) and ends with the same adapter, bit for
    bit."""
    import json as _json

    from tests.conftest import resumes_bit_identical

    data = mllm_demo(tmp_path / "data", n=12)
    cfg = _cfg(qwen2_vl, data, max_steps=4)
    cfg["model"].update(finetuning_type="lora", lora_rank=4)
    cfg["data"]["record_examples"] = True
    cfg["checkpoint"] = {"save_steps": 2}
    whole, again = resumes_bit_identical(cfg, tmp_path, 2, weights="adapter_model.safetensors")

    def trained(run):
        rows = [_json.loads(line) for f in sorted((run / "examples").glob("*.jsonl")) for line in
                f.read_text().splitlines()]
        return {r["step"]: r["ids"] for r in rows if r["step"] > 2}

    assert trained(whole) == trained(again) and set(trained(whole)) == {3, 4}

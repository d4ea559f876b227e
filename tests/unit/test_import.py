"""`scaletrain import llamafactory|deepspeed`: configs users already have become scaletrain configs, with a table."""

import shutil
from pathlib import Path

import pytest
import yaml

from scaletrain.config import load_config, validate
from scaletrain.config.importers import from_deepspeed, from_llamafactory
from scaletrain.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory"


def _rows(rows):
    return {r.key: r for r in rows}


def test_lora_example_maps_every_key_or_says_why():
    lf = yaml.safe_load((FIXTURES / "llama3_lora_sft.yaml").read_text())
    cfg, rows = from_llamafactory(lf)
    c = validate(cfg)
    assert (c.model.name_or_path, c.model.task, c.model.finetuning_type, c.model.lora_target) == (
        "/models/Meta-Llama-3-8B-Instruct", "causal-lm", "lora", "all-linear")
    assert c.data.dataset == ["identity", "alpaca_en_demo"] and c.data.dataset_dir == "data"
    assert (c.data.template, c.data.max_length, c.data.max_samples, c.data.loader_workers) == ("llama3", 2048, 1000, 4)
    t = c.train
    assert (t.per_device_train_batch_size, t.gradient_accumulation_steps, t.learning_rate) == (1, 8, 1e-4)
    assert c.train.bf16 and c.train.lr_scheduler_type == "cosine"
    assert c.comm.timeout_s == 1800  # 180000000 would switch hang detection off: kept, and said
    assert "switch hang detection off" in _rows(rows)["ddp_timeout"].note
    # LLaMA-Factory's defaults where its file is silent: no hold-out, lora_alpha = 2 x rank
    assert c.data.eval_ratio == 0.0 and c.model.lora_alpha == 16 and c.model.lora_rank == 8
    assert c.monitor.report_to == ["jsonl"]  # report_to: none
    assert (c.output.output_dir, c.output.run_name, c.checkpoint.save_steps) == ("saves/llama3-8b/lora", "sft", 500)
    by_key = _rows(rows)
    assert set(by_key) >= set(lf)  # every key of the file has a row
    assert by_key["plot_loss"].where == "" and "report.md" in by_key["plot_loss"].note
    assert by_key["trust_remote_code"].where == "" and by_key["learning_rate"].where == "train.learning_rate"


def test_full_example_with_zero3_becomes_fsdp_with_auto_values_from_the_training_keys():
    lf = yaml.safe_load((FIXTURES / "qwen2_full_sft.yaml").read_text())
    ds = __import__("json").loads((FIXTURES / "ds_z3_config.json").read_text())
    cfg, rows = from_llamafactory(lf, ds)
    c = validate(cfg)
    assert c.train.strategy == "fsdp" and c.data.template == "qwen" and c.data.eval_ratio == 0.1
    assert c.train.per_device_train_batch_size == 1 and c.train.gradient_accumulation_steps == 2
    by_key = _rows(rows)
    assert "ZeRO-3 = FSDP2" in by_key["zero_optimization.stage"].note
    assert by_key["train_micro_batch_size_per_gpu"].note == "auto: 1 from the training keys"
    ds_leaves = {"fp16.loss_scale", "fp16.initial_scale_power", "zero_optimization.overlap_comm",
                 "zero_optimization.stage3_max_live_parameters", "zero_allow_untested_optimizer", "train_batch_size",
                 "zero_optimization.stage3_gather_16bit_weights_on_model_save", "bf16.enabled"}
    assert ds_leaves <= set(by_key) and set(by_key) >= set(lf)  # every key of both files has a row
    assert by_key["zero_optimization.overlap_comm"].note.startswith("ignored: DeepSpeed's bucket")


def test_llamafactory_keys_keep_their_meaning():
    lf = {"model_name_or_path": "/m", "stage": "sft", "finetuning_type": "lora", "lora_rank": 32,
          "lora_target": "q_proj,v_proj", "dataset": "glaive_toolcall_en_demo", "eval_dataset": "alpaca_en_demo",
          "template": "qwen", "neat_packing": True, "packing": True, "ray_num_workers": 4, "report_to": "wandb",
          "group_by_length": True, "ddp_timeout": 3600, "output_dir": "saves/x"}
    cfg, rows = from_llamafactory(lf)
    c = validate(cfg)
    assert c.model.lora_alpha == 64 and c.model.lora_target == ["q_proj", "v_proj"]
    assert c.data.eval_dataset == ["alpaca_en_demo"] and c.data.eval_ratio == 0.1  # eval set given: no hold-out cut
    assert c.data.packing and c.scaling.num_workers == 4 and c.monitor.report_to == ["jsonl", "wandb"]
    assert c.data.balance_ranks and c.comm.timeout_s == 3600 and c.data.template == "qwen"
    by_key = _rows(rows)
    assert set(by_key) >= set(lf) and by_key["eval_dataset"].where == "data.eval_dataset"
    _, rows = from_llamafactory({**lf, "stage": "ppo"})
    assert "is not in scaletrain" in _rows(rows)["stage"].note and _rows(rows)["stage"].where == ""
    for stage in ("rm", "kto"):
        cfg, rows = from_llamafactory({**lf, "stage": stage, "packing": False, "neat_packing": False,
                                       "kto_chosen_weight": 1.3})
        assert validate(cfg).train.stage == stage and validate(cfg).train.kto_chosen_weight == 1.3
    cfg, rows = from_llamafactory({**lf, "stage": "pt"})
    assert validate(cfg).data.formatting == "text"


def test_deepspeed_stages_and_offload():
    z2, rows = from_deepspeed(__import__("json").loads((FIXTURES / "ds_z2_config.json").read_text()), {})
    assert z2["strategy"] == "ddp"
    note = _rows(rows)["zero_optimization.stage"].note
    assert "ZeRO-2 shards the optimizer state and gradients" in note and "12 bytes per parameter" in note
    off, rows = from_deepspeed(__import__("json").loads((FIXTURES / "ds_z3_offload_config.json").read_text()), {})
    assert off == {"strategy": "fsdp", "per_device_train_batch_size": 2, "bf16": True}
    assert "not yet supported" in _rows(rows)["zero_optimization.offload_param.device"].note
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=2 disagrees with the training key "
                                          "per_device_train_batch_size=4"):
        from_deepspeed({"train_micro_batch_size_per_gpu": 2}, {"per_device_train_batch_size": 4})


def _cli(*args, cwd=None):
    from tests.cli import run_cli

    return run_cli(*args, cwd=cwd)


@pytest.mark.loop
def test_cli_writes_the_config_prints_the_table_and_never_overwrites(tmp_path):
    for name in ("qwen2_full_sft.yaml", "ds_z3_config.json"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    out = tmp_path / "job.yaml"
    proc = _cli("import", "llamafactory", tmp_path / "qwen2_full_sft.yaml", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "zero_optimization.stage" in proc.stderr and "not mapped" in proc.stderr
    assert load_config(out).train.strategy == "fsdp"
    again = _cli("import", "llamafactory", tmp_path / "qwen2_full_sft.yaml", "-o", out)
    assert again.returncode == 2 and "never overwritten" in again.stderr
    ds = _cli("import", "deepspeed", tmp_path / "ds_z3_config.json")
    assert ds.returncode == 0 and yaml.safe_load(ds.stdout) == {"train": {"strategy": "fsdp"}}


@pytest.mark.loop
def test_train_on_a_llamafactory_file_says_which_command_converts_it(tmp_path):
    shutil.copy(FIXTURES / "llama3_lora_sft.yaml", tmp_path / "lf.yaml")
    proc = _cli("train", tmp_path / "lf.yaml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is a LLaMA-Factory config; convert it first: scaletrain import llamafactory" in proc.stderr


def test_a_llamafactory_dpo_file_becomes_a_dpo_job():
    """After LLaMA-Factory's examples/train_lora/llama3_lora_dpo.yaml (our own fixture)."""
    lf = yaml.safe_load((FIXTURES / "llama3_lora_dpo.yaml").read_text())
    cfg, rows = from_llamafactory(lf)
    c = validate(cfg)
    assert (c.train.stage, c.train.pref_loss, c.train.pref_beta, c.train.pref_ftx) == ("dpo", "sigmoid", 0.1, 0.0)
    assert c.data.dataset == ["dpo_en_demo"] and c.model.finetuning_type == "lora"
    assert set(_rows(rows)) >= set(lf)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "gpt", "gpt_oss", "llama4", "mistral_small"])
def test_the_2026_template_names_map_to_the_models_own_with_the_reason(name):
    from scaletrain.config.importers import LF_OWN_TEMPLATE

    cfg, rows = from_llamafactory({"model_name_or_path": "m", "stage": "sft", "finetuning_type": "lora",
                                   "dataset": "d", "template": name, "do_train": True})
    row = next(r for r in rows if r.key == "template")
    assert cfg["data"]["template"] == "auto" and row.where == "data.template"
    assert row.note == f"LLaMA-Factory's {name!r} -> the tokenizer's own chat template: {LF_OWN_TEMPLATE[name]}"


@pytest.mark.parametrize("name,builtin", [("gemma3", "gemma3"), ("deepseekr1", "deepseek_r1"),
                                          ("qwen3_nothink", "qwen3_nothink")])
def test_the_2026_names_with_a_built_in_map_to_it(name, builtin):
    cfg, rows = from_llamafactory({"model_name_or_path": "m", "stage": "sft", "finetuning_type": "lora",
                                   "dataset": "d", "template": name, "do_train": True})
    assert cfg["data"]["template"] == builtin and validate(cfg).data.template == builtin
    note = next(r for r in rows if r.key == "template").note
    if name == "qwen3_nothink":  # where the built-in departs from LLaMA-Factory's template: said
        assert "Qwen3-Instruct-2507's own template" in note and "LLaMA-Factory's writes none" in note


def test_an_unknown_template_name_is_said_not_silently_mapped():
    _, rows = from_llamafactory({"model_name_or_path": "m", "stage": "sft", "finetuning_type": "lora",
                                 "dataset": "d", "template": "someday", "do_train": True})
    assert "no built-in for LLaMA-Factory's 'someday'" in next(r for r in rows if r.key == "template").note


def test_the_moe_aux_loss_coefficient_imports_with_its_meaning():
    cfg, rows = from_llamafactory({"model_name_or_path": "/m", "stage": "sft", "finetuning_type": "lora",
                                   "dataset": "alpaca_en_demo", "moe_aux_loss_coef": 0.001,
                                   "expert_model_parallel_size": 4})
    assert validate(cfg).train.moe_aux_loss_coef == 0.001
    assert _rows(rows)["moe_aux_loss_coef"].where == "train.moe_aux_loss_coef"
    ep = _rows(rows)["expert_model_parallel_size"]  # Megatron's expert parallelism: said, not silently dropped
    assert ep.where == "" and ep.note.startswith("expert parallelism is not offered")


def test_a_ppo_file_names_grpo_and_writes_no_config(tmp_path, capsys):
    """LLaMA-Factory's stage: ppo: one line naming GRPO as the RL stage scaletrain has, and no config written (#61;
    a config with no task, so the default, sequence classification, was written before)."""
    from scaletrain.cli import main

    lf = tmp_path / "ppo.yaml"
    lf.write_text(yaml.safe_dump({"model_name_or_path": "/models/qwen", "stage": "ppo", "do_train": True,
                                  "finetuning_type": "lora", "dataset": "alpaca_en_demo", "template": "qwen",
                                  "reward_model": "saves/rm"}))
    out = tmp_path / "job.yaml"
    assert main(["import", "llamafactory", str(lf), "-o", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "stage=ppo" in err and "train.stage: grpo" in err and "no config written" in err
    assert not out.exists()


def test_a_trl_grpo_yaml_imports_with_a_row_per_key(tmp_path, capsys):
    """`scaletrain import trl`: the YAML a TRL user gives `trl grpo --config` (#61): GRPOConfig's names map one to
    one into rl:, TRL's registered rewards to the built-ins, a module.function path to its file; what does not map is
    a row; the written config validates."""
    from scaletrain.cli import main

    model = tmp_path / "qwen"
    model.mkdir()
    data = tmp_path / "prompts.jsonl"
    data.write_text("")
    trl = tmp_path / "grpo.yaml"
    trl.write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "dataset_name": str(data), "dataset_train_split": "train",
        "reward_funcs": ["accuracy_reward", "think_format_reward", "my_rewards.strict"],
        "num_generations": 8, "max_completion_length": 256, "loss_type": "dr_grpo", "beta": 0.02,
        "epsilon_high": 0.28, "scale_rewards": False, "learning_rate": 1e-6, "per_device_train_batch_size": 16,
        "use_peft": True, "lora_r": 16, "use_vllm": False, "output_dir": str(tmp_path / "out"),
        "log_completions": True}))
    out = tmp_path / "job.yaml"
    assert main(["import", "trl", str(trl), "-o", str(out)]) == 0
    table = capsys.readouterr().err
    cfg = yaml.safe_load(out.read_text())
    assert cfg["train"]["stage"] == "grpo" and cfg["model"]["finetuning_type"] == "lora"
    assert cfg["rl"]["reward_funcs"] == ["accuracy", "format", "my_rewards.py:strict"]
    assert cfg["rl"]["answer_column"] == "solution" and cfg["rl"]["loss_type"] == "dr_grpo"
    assert cfg["data"]["train_file"] == str(data) and cfg["model"]["lora_rank"] == 16
    assert "log_completions" in table and "dataset_train_split" in table and "no scaletrain equivalent" in table
    validate(cfg)  # (scale_rewards: false is TRL's none)
    assert validate(cfg).rl.scale_rewards == "none"


def test_a_trl_file_whose_only_reward_is_unknown_writes_nothing(tmp_path, capsys):
    """#72: a GRPO job without a reward function cannot run (doctor: "give at least one reward function"): the
    import says which key to fix, exits non-zero and writes no config (it wrote `rl.reward_funcs: []` before)."""
    from scaletrain.cli import main

    trl = tmp_path / "grpo.yaml"
    trl.write_text(yaml.safe_dump({"model_name_or_path": "Qwen/Qwen3-0.6B", "reward_funcs": ["no_such_reward"],
                                   "num_generations": 4}))
    out = tmp_path / "job.yaml"
    assert main(["import", "trl", str(trl), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "reward_funcs=['no_such_reward']" in err and "no config written" in err
    assert "no_such_reward: not one of TRL's registered rewards" in err and not out.exists()


def test_llamafactorys_qlora_example_imports_with_its_quantization_keys():
    """LLaMA-Factory's examples/train_qlora/qwen3_lora_sft_bnb_npu.yaml (#63): quantization_bit, the method and the
    double quantization land in model.*, none of them dropped as 'no equivalent'."""
    lf = yaml.safe_load((FIXTURES / "qwen3_lora_sft_bnb_npu.yaml").read_text())
    cfg, rows = from_llamafactory(lf)
    m = validate(cfg).model
    assert (m.quantization_bit, m.quantization_method, m.double_quantization, m.finetuning_type) == (
        4, "bnb", False, "lora")
    by_key = _rows(rows)
    assert {by_key[k].where for k in ("quantization_bit", "quantization_method", "double_quantization")} == {
        "model.quantization_bit", "model.quantization_method", "model.double_quantization"}


@pytest.mark.parametrize("name", ["qwen3vl_lora_sft.yaml", "qwen3vl_full_sft.yaml", "qwen3vl_lora_dpo.yaml"])
def test_llamafactorys_vision_language_examples_import_with_their_meaning(name):
    """LLaMA-Factory's multimodal examples (#62): image bounds, the parts frozen, the model's own template; the
    video key of an image job is a row that says videos are refused, never a silent text-only job."""
    lf = yaml.safe_load((FIXTURES / name).read_text())
    cfg, rows = from_llamafactory(lf)
    c = validate(cfg)
    by_key = _rows(rows)
    assert set(by_key) >= set(lf) and not any("cannot run here" in r.note for r in rows)
    assert (c.data.image_max_pixels, c.data.image_min_pixels, c.data.template) == (262144, 32 * 32, "auto")
    assert "the model's own chat template" in by_key["template"].note
    assert "videos are not supported" in by_key["video_max_pixels"].note
    assert (c.model.freeze_vision_tower, c.model.freeze_multi_modal_projector, c.model.freeze_language_model) == (
        True, True, False)
    if name == "qwen3vl_lora_dpo.yaml":
        assert c.train.stage == "dpo" and c.data.dataset == ["rlhf_v"]
    else:
        assert c.data.dataset == ["mllm_demo", "identity", "alpaca_en_demo"]


@pytest.mark.parametrize("extra", [{"image_do_pan_and_scan": True}, {"use_audio_in_video": True},
                                   {"template": "llava"}])
def test_a_multimodal_file_scaletrain_cannot_train_is_refused_whole(tmp_path, capsys, extra):
    """What scaletrain has no equivalent of (pan-and-scan crops, audio, a VL family it does not know) stops the
    import in one line, and no config is written (never a job that drops the images or the audio)."""
    from scaletrain.cli import main

    lf = tmp_path / "vl.yaml"
    lf.write_text(yaml.safe_dump({"model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct", "stage": "sft", "do_train": True,
                                  "finetuning_type": "lora", "dataset": "mllm_demo,identity",
                                  "template": "qwen3_vl_nothink", **extra}))
    out = tmp_path / "job.yaml"
    assert main(["import", "llamafactory", str(lf), "-o", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "a multimodal job scaletrain cannot train yet" in err and "no config written" in err
    assert not out.exists()

import pytest

from scaletrain.config import load_config
from scaletrain.config.load import apply_override, interpolate_env
from scaletrain.errors import ConfigError
from tests.conftest import write_config


def test_valid_config_loads_with_defaults(classify_cfg, tmp_path):
    cfg = load_config(write_config(tmp_path / "c.yaml", classify_cfg))
    assert cfg.train.per_device_train_batch_size == 8
    assert cfg.train.gradient_accumulation_steps == 1  # default
    assert cfg.comm.backend == "auto"
    assert cfg.scaling.placement_strategy == "PACK"


def test_unknown_key_names_nearest(classify_cfg, tmp_path):
    classify_cfg["train"]["learnig_rate"] = 1e-4
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))
    msg = str(e.value)
    assert "unknown key 'train.learnig_rate'" in msg and "did you mean 'train.learning_rate'" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("section,key", [("scaling", "expert_parallel_size"), ("train", "ep_size")])
def test_expert_parallelism_asked_is_one_line_saying_why(classify_cfg, tmp_path, section, key):
    classify_cfg.setdefault(section, {})[key] = 2
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))
    msg = str(e.value)
    assert f"'{section}.{key}': expert parallelism is not offered: the experts are sharded with the rest of each " \
        f"decoder block by FSDP (train.strategy: fsdp); remove the key" in msg and "\n" not in msg


def test_unknown_section_is_named(classify_cfg, tmp_path):
    classify_cfg["trian"] = {"seed": 1}
    with pytest.raises(ConfigError, match=r"unknown key 'trian'; did you mean 'train'"):
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))


def test_wrong_type_names_key_value_and_allowed(classify_cfg, tmp_path):
    classify_cfg["train"]["strategy"] = "zero3"
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))
    assert "train.strategy='zero3'" in str(e.value) and "'ddp' or 'fsdp'" in str(e.value)


def test_num_workers_zero_rejected(classify_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"scaling.num_workers=0 .*greater than or equal to 1"):
        load_config(write_config(tmp_path / "c.yaml", classify_cfg), ["scaling.num_workers=0"])


def test_overrides_are_typed(classify_cfg, tmp_path):
    path = write_config(tmp_path / "c.yaml", classify_cfg)
    cfg = load_config(path, ["scaling.num_workers=4", "train.learning_rate=3e-4", "train.bf16=true",
                             "model.lora_target=[q_proj,v_proj]"])
    assert cfg.scaling.num_workers == 4 and cfg.train.learning_rate == 3e-4 and cfg.train.bf16 is True
    assert cfg.model.lora_target == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="train.per_device_train_batch_size='many'"):
        load_config(path, ["train.per_device_train_batch_size=many"])
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(path, ["num_workers"])
    with pytest.raises(ConfigError, match="unknown key 'scaling.num_worker'"):
        load_config(path, ["scaling.num_worker=2"])


def test_env_interpolation():
    env = {"DATA": "/data", "EMPTY": ""}
    out = interpolate_env({"a": {"b": "${DATA}/x.jsonl", "c": "${MISSING:-fallback}", "d": ["${EMPTY}z"]}}, env)
    assert out == {"a": {"b": "/data/x.jsonl", "c": "fallback", "d": ["z"]}}
    with pytest.raises(ConfigError, match=r"a.b: environment variable NOPE is not set"):
        interpolate_env({"a": {"b": "${NOPE}"}}, env)


def test_env_interpolation_in_file(classify_cfg, tmp_path, monkeypatch):
    classify_cfg["output"]["output_dir"] = "${OUT_ROOT:-runs}/exp"
    path = write_config(tmp_path / "c.yaml", classify_cfg)
    monkeypatch.setenv("OUT_ROOT", "/scratch")
    assert load_config(path).output.output_dir == "/scratch/exp"


def test_malformed_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  name_or_path: [unclosed\ndata: {}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: malformed YAML at line \d+"):
        load_config(p)


def test_missing_and_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(tmp_path / "empty.yaml")


def test_required_section_missing(tmp_path):
    p = write_config(tmp_path / "c.yaml", {"model": {"name_or_path": "builtin:tiny-bert"}})
    with pytest.raises(ConfigError, match="'data' is required"):
        load_config(p)


def test_cross_field_rules(classify_cfg, tmp_path):
    path = write_config(tmp_path / "c.yaml", classify_cfg)
    with pytest.raises(ConfigError, match="bf16 and fp16 are both true"):
        load_config(path, ["train.bf16=true", "train.fp16=true"])
    with pytest.raises(ConfigError, match="max_steps=0"):
        load_config(path, ["train.max_steps=0"])


def test_apply_override_creates_nested():
    raw = {}
    apply_override(raw, "comm.env.NCCL_DEBUG=INFO")
    assert raw == {"comm": {"env": {"NCCL_DEBUG": "INFO"}}}


def test_every_problem_of_a_file_is_reported_at_once_one_line_each(classify_cfg, tmp_path):
    classify_cfg["train"].update(learnig_rate=1, per_device_train_batch_size="big")
    classify_cfg["scaling"]["num_workers"] = 0
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))
    lines = str(e.value).splitlines()
    assert len(lines) == 3 and all(ln.startswith(f"{tmp_path / 'c.yaml'}: ") for ln in lines)
    assert any("unknown key 'train.learnig_rate'" in ln for ln in lines)
    assert any("train.per_device_train_batch_size='big'" in ln for ln in lines)
    assert any("scaling.num_workers=0" in ln for ln in lines)


def test_a_section_rule_prints_its_message_not_the_section(classify_cfg, tmp_path):
    classify_cfg["scaling"].update(launcher="torchrun", num_workers=3, nnodes=2)
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))
    assert str(e.value) == (f"{tmp_path / 'c.yaml'}: scaling.num_workers=3 must be a multiple of scaling.nnodes=2 "
                            f"(the same number of processes on every node)")


@pytest.mark.parametrize("section,key,nearest", [
    ("train", "save_steps", "checkpoint.save_steps"),  # not train.max_steps: the exact name lives elsewhere
    ("data", "num_workers", "scaling.num_workers"),
    ("train", "learnig_rate", "train.learning_rate"),  # the own section still wins a near miss
    ("monitor", "report_too", "monitor.report_to"),
])
def test_the_nearest_key_is_searched_across_sections(classify_cfg, tmp_path, section, key, nearest):
    classify_cfg.setdefault(section, {})[key] = 1
    with pytest.raises(ConfigError, match=rf"unknown key '{section}.{key}'; did you mean '{nearest}'\?"):
        load_config(write_config(tmp_path / "c.yaml", classify_cfg))


def test_a_key_given_twice_names_the_key_and_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  name_or_path: builtin:tiny-bert\ndata:\n  train_file: x.jsonl\ntrain:\n"
                    "  max_steps: 5\n  seed: 3\ntrain:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"c.yaml: key 'train' is given twice \(lines 5 and 8\); keep one"):
        load_config(path)
    path.write_text("model:\n  name_or_path: a\n  name_or_path: b\ndata: {train_file: x}\n")
    with pytest.raises(ConfigError, match=r"key 'name_or_path' is given twice \(lines 2 and 3\)"):
        load_config(path)


def test_elastic_range_in_rays_spelling():
    from scaletrain.config import validate

    base = {"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"}}
    ray_style = validate({**base, "scaling": {"min_workers": 2, "max_workers": 4, "elastic_batch": "nearest"}}).scaling
    ours = validate({**base, "scaling": {"num_workers": [2, 4], "elastic_batch": "nearest"}}).scaling
    assert (ray_style.min_workers, ray_style.max_workers, ray_style.elastic) == (2, 4, True) == (
        ours.min_workers, ours.max_workers, ours.elastic)
    with pytest.raises(ConfigError, match=r"scaling.max_workers=4 and scaling.num_workers=3 are both set"):
        validate({**base, "scaling": {"num_workers": 3, "max_workers": 4}})


def test_the_records_an_epoch_leaves_out_are_said():
    """LLaMA-Factory trains all 900 records; a whole-global-batch step cannot: the count is said at start."""
    from scaletrain.config.batch import left_out_note
    from scaletrain.config.schema import TrainConfig

    train = TrainConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2)
    note = left_out_note(900, train, world_size=2)  # global batch 16: 56 steps, 896 trained, 4 left
    assert note.startswith("data: each epoch trains 896 of 900 examples: the last 4 do not fill a global batch of 16")
    assert left_out_note(896, train, world_size=2) is None
    assert "of 10 packed rows" in left_out_note(10, TrainConfig(per_device_train_batch_size=3), 1, "packed rows")


def test_contradictory_image_bounds_are_one_line_at_load(classify_cfg, tmp_path):
    """#72: image_min_pixels above image_max_pixels trained before, which bound won said nowhere."""
    path = write_config(tmp_path / "c.yaml", classify_cfg)
    with pytest.raises(ConfigError) as e:
        load_config(path, ["data.image_max_pixels=100", "data.image_min_pixels=1000"])
    msg = str(e.value)
    assert "data.image_min_pixels=1000 is above data.image_max_pixels=100" in msg and "\n" not in msg
    assert "set image_min_pixels <= image_max_pixels" in msg
    assert load_config(path, ["data.image_max_pixels=1000", "data.image_min_pixels=1000"]).data.image_min_pixels == 1000

"""A fuzzed front door (hypothesis): the config loader, the override parser, the data readers, corrupted data
and checkpoint files. The property everywhere: it loads, or it raises the project's user error with a one-line
message; never another exception (which the CLI would print as a traceback)."""

import json
import shutil
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaletrain import checkpoint
from scaletrain.config import load_config, validate
from scaletrain.config.schema import Config
from scaletrain.data import prepare_data
from scaletrain.errors import ScaletrainError
from scaletrain.model.tokenizer import load_tokenizer

# No example database on disk, few examples: the whole file runs in well under a minute in make test-fast.
# Derandomized (the same examples every run): one random record set once crashed the process inside pyarrow's
# JSON reader (a segfault in datasets' json builder, 2026-12-02), which no assertion here can catch; a fixed set
# keeps the suite reproducible. Set derandomize=False locally to explore other examples.
FAST = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=25)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(string.printable, max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(string.ascii_letters + "_", min_size=1,
                                                                               max_size=10), inner, max_size=3)),
                      max_leaves=8)
SECTION_KEYS = {s: list(Config.model_fields[s].annotation.model_fields) for s in Config.model_fields}
section_names = st.sampled_from(sorted(SECTION_KEYS))


@st.composite
def configs(draw):
    """Mostly real sections and keys with arbitrary values; sometimes arbitrary names and nesting."""
    out = {"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "d.jsonl"}}
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.one_of(section_names, st.text(string.ascii_lowercase, min_size=1, max_size=8)))
        keys = SECTION_KEYS.get(section) or ["x"]
        key = draw(st.one_of(st.sampled_from(keys), st.text(string.ascii_lowercase + "_", min_size=1, max_size=12)))
        out.setdefault(section, {}) if isinstance(out.get(section), dict) else out.update({section: {}})
        out[section][key] = draw(values)
    if draw(st.booleans()):
        out[draw(section_names)] = draw(values)  # a section that is not a mapping
    return out


def _one_line_user_error(fn, source: str | None = None):
    """``fn()``, or a user error: one line (a config names each of its problems on a line of its own, each
    starting with the file's name)."""
    try:
        return fn()
    except ScaletrainError as e:
        lines = str(e).splitlines()
        assert lines and all(ln.strip() for ln in lines), repr(str(e))
        if len(lines) > 1:
            assert source is not None and all(ln.startswith((f"{source}: ", "override ")) for ln in lines), str(e)
        return None


def _yaml_safe(obj) -> str:
    return yaml.safe_dump(obj, allow_unicode=True)


@FAST
@given(cfg=configs())
def test_config_loader_accepts_or_names_the_problem(tmp_path, cfg):
    path = tmp_path / "c.yaml"
    path.write_text(_yaml_safe(cfg))
    _one_line_user_error(lambda: load_config(path), str(path))


@FAST
@given(text=st.text(max_size=200))
def test_arbitrary_yaml_text(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    _one_line_user_error(lambda: load_config(path), str(path))


@FAST
@given(overrides=st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda s, k, v: f"{s}.{k}={v}", section_names, st.sampled_from(sorted({k for ks in SECTION_KEYS.values()
                                                                                     for k in ks})),
              st.text(string.printable, max_size=15))), max_size=4))
def test_override_parser(tmp_path, overrides):
    path = tmp_path / "c.yaml"
    path.write_text(_yaml_safe({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "d.jsonl"}}))
    _one_line_user_error(lambda: load_config(path, overrides), str(path))


@pytest.fixture(scope="module")
def tokenizers():
    return {"bert": load_tokenizer("builtin:tiny-bert"), "llama": load_tokenizer("builtin:tiny-llama")}


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False),
                                     st.text(max_size=20)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(
                                                       ["text", "label", "instruction", "input", "output",
                                                        "conversations", "from", "value", "role", "content",
                                                        "messages", "x"]), inner, max_size=4)),
                           max_leaves=10)
records = st.one_of(json_values, st.fixed_dictionaries({"text": json_values, "label": json_values}),
                    st.fixed_dictionaries({"instruction": json_values, "output": json_values}),
                    st.fixed_dictionaries({"conversations": st.lists(st.fixed_dictionaries(
                        {"from": st.sampled_from(["human", "gpt", "system", "robot"]), "value": json_values}),
                        max_size=4)}))


def _data_cfg(tmp_path: Path, path: Path, kind: str):
    if kind == "bert":
        return validate({"model": {"name_or_path": "builtin:tiny-bert"},
                         "data": {"train_file": str(path), "max_length": 16, "max_bad_ratio": 0.5},
                         "output": {"output_dir": str(tmp_path / "runs")}})
    formatting = "sharegpt" if kind == "sharegpt" else "alpaca"
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                     "data": {"train_file": str(path), "max_length": 32, "formatting": formatting,
                              "template": "chatml", "max_bad_ratio": 0.5},
                     "output": {"output_dir": str(tmp_path / "runs")}})


@SLOW
@given(rows=st.lists(records, min_size=1, max_size=12), kind=st.sampled_from(["bert", "alpaca", "sharegpt"]),
       as_lines=st.booleans())
def test_data_readers_take_any_record_shape(tmp_path, tokenizers, rows, kind, as_lines):
    path = tmp_path / ("d.jsonl" if as_lines else "d.json")
    path.write_text("\n".join(json.dumps(r) for r in rows) if as_lines else json.dumps(rows))
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    _one_line_user_error(lambda: prepare_data(_data_cfg(tmp_path, path, kind),
                                              tokenizers["llama" if kind != "bert" else "bert"]))


GOOD_ROWS = "\n".join(json.dumps({"text": f"good movie {i}", "label": i % 2}) for i in range(40)).encode()


@SLOW
@given(flips=st.lists(st.tuples(st.integers(0, len(GOOD_ROWS) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(1, len(GOOD_ROWS))))
def test_corrupted_data_files(tmp_path, tokenizers, flips, cut):
    data = bytearray(GOOD_ROWS)
    for at, byte in flips:
        data[at] = byte
    path = tmp_path / "d.jsonl"
    path.write_bytes(bytes(data[:cut]))
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    _one_line_user_error(lambda: prepare_data(_data_cfg(tmp_path, path, "bert"), tokenizers["bert"]))


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A real checkpoint of a short in-process run."""
    from scaletrain.launch.local import run_in_process
    from tests.conftest import local_spec

    base = tmp_path_factory.mktemp("ckpt")
    rows = base / "d.jsonl"
    rows.write_bytes(GOOD_ROWS)
    cfg = {"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": str(rows), "max_length": 16},
           "train": {"per_device_train_batch_size": 4, "max_steps": 2}, "checkpoint": {"save_steps": 2}}
    _, _, spec = local_spec(cfg, base / "run")
    run_in_process(spec)
    return checkpoint.list_checkpoints(base / "run" / "checkpoints")[-1]


@SLOW
@given(name=st.sampled_from(["state/__0_0.distcp", "state/.metadata", "trainer_state.pt", "rng-rank0.pt",
                             "manifest.json"]),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.floats(0, 1)))
@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_corrupted_checkpoint_files_are_found_unusable(tmp_path, saved_checkpoint, name, flips, cut):
    ckpt = tmp_path / "checkpoints" / saved_checkpoint.name
    shutil.rmtree(tmp_path / "checkpoints", ignore_errors=True)
    shutil.copytree(saved_checkpoint, ckpt)
    f = ckpt / name
    data = bytearray(f.read_bytes())
    for at, byte in flips:
        data[int(at * len(data))] = byte
    data = data[: int(cut * len(data))] if cut is not None else data
    changed = bytes(data) != f.read_bytes()
    f.write_bytes(bytes(data))
    problem = checkpoint.verify(ckpt)
    if changed:
        assert problem, f"{name} changed but the checkpoint verified"
    found, unusable = checkpoint.resume_point(tmp_path / "checkpoints")
    assert (found is None) == bool(problem) and (not unusable) == (not problem)
    if not problem:  # the bytes are unchanged: it loads
        from torch.distributed.checkpoint import FileSystemReader

        assert FileSystemReader(str(ckpt / "state")).read_metadata().state_dict_metadata


MUTABLE = {s: [k for k in keys if (s, k) not in {("data", "cache_dir"), ("data", "train_file")}]
           for s, keys in SECTION_KEYS.items() if s != "output"}  # the job writes under tmp_path only


@st.composite
def mutated_jobs(draw):
    """A valid job (config text, data bytes) with a few of the mistakes people make: keys deleted, values of
    another type, a key given twice, bytes flipped in the config, the data file cut short."""
    cfg = {"model": {"name_or_path": "builtin:tiny-bert", "num_labels": 2},
           "data": {"train_file": "d.jsonl", "max_length": 16, "eval_ratio": 0.2},
           "train": {"per_device_train_batch_size": 4, "max_steps": 2}}
    data = GOOD_ROWS
    for op in draw(st.lists(st.sampled_from(["delete", "retype", "duplicate", "flip", "cut"]), min_size=1,
                            max_size=3)):
        if op == "delete":
            section = draw(st.sampled_from(sorted(cfg)))
            if isinstance(cfg[section], dict) and cfg[section]:
                cfg[section].pop(draw(st.sampled_from(sorted(cfg[section]))))
        elif op == "retype":
            section = draw(st.sampled_from(sorted(MUTABLE)))
            cfg.setdefault(section, {})
            if isinstance(cfg[section], dict):
                cfg[section][draw(st.sampled_from(MUTABLE[section]))] = draw(values)
        elif op == "cut":
            data = data[: draw(st.integers(0, len(data)))]
    text = _yaml_safe(cfg).encode()
    ops_text = draw(st.lists(st.sampled_from(["duplicate", "flip"]), max_size=2))
    for op in ops_text:
        lines = text.splitlines(keepends=True)
        if op == "duplicate" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            text = b"".join(lines[: i + 1] + [lines[i]] + lines[i + 1:])
        elif op == "flip" and text:
            at = draw(st.integers(0, len(text) - 1))
            text = text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1:]
    return text, data


@SLOW
@given(job=mutated_jobs())
def test_trains_preflight_accepts_or_says_one_line(tmp_path, job):
    """The property of `train`'s front door as a whole: config file -> load -> output directory -> preflight
    (model, tokenizer, data, memory shape) accepts the job or raises scaletrain's own error, one line a problem."""
    from scaletrain.launch.preflight import preflight
    from scaletrain.rundir import check_output_dir

    text, data = job
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    (tmp_path / "d.jsonl").write_bytes(data)
    path = tmp_path / "c.yaml"
    path.write_bytes(text)

    def front_door():
        cfg = load_config(path, [f"data.train_file={tmp_path / 'd.jsonl'}", f"output.output_dir={tmp_path / 'runs'}"])
        check_output_dir(cfg.output.output_dir, cfg.output.run_name)
        return preflight(cfg)

    _one_line_user_error(front_door, str(path))

"""#74, train.stage: distill (on-policy distillation, TRL's GKD names) in-process: the student samples, the teacher
scores every sampled position, the generalized JSD trains the student. A teacher equal to the student gives zero
loss and zero gradient; another teacher's divergence falls as the student learns; bad input is one line."""

import json
import random

import pytest
import torch

from scaletrain.launch.local import run_in_process
from scaletrain.metrics.records import read_jsonl
from tests.conftest import local_spec, save_tiny_llama

pytestmark = pytest.mark.loop


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The student (tiny Llama, seed 0) and a teacher of the same tokenizer with other weights."""
    root = tmp_path_factory.mktemp("distill")
    student = save_tiny_llama(root / "student", hidden=64, intermediate=128)
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(str(student))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    net.save_pretrained(root / "teacher")
    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    tiny_llama_tokenizer().save_pretrained(root / "teacher")
    return student, root / "teacher"


@pytest.fixture
def prompts(tmp_path):
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": f"What is {rng.randint(0, 9)}+{rng.randint(0, 9)}?"}]}
            for _ in range(64)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(student, teacher, prompts, steps: int = 3, **rl) -> dict:
    return {"model": {"name_or_path": str(student), "task": "causal-lm", "finetuning_type": "full", "dropout": 0.0},
            "data": {"train_file": str(prompts), "formatting": "messages", "max_length": 64, "eval_ratio": 0},
            "train": {"stage": "distill", "per_device_train_batch_size": 8, "max_steps": steps,
                      "learning_rate": 2e-3, "logging_steps": 1},
            "rl": {"teacher_model": str(teacher), "num_generations": 2, "max_completion_length": 8, **rl},
            "scaling": {"num_workers": 1}}


def _records(run) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.slow  # two whole runs: make test, not make test-fast
def test_a_teacher_equal_to_the_student_gives_nothing_and_another_teachers_divergence_falls(models, prompts,
                                                                                           tmp_path):
    student, teacher = models
    _, _, spec = local_spec(_cfg(student, student, prompts, steps=2, beta=1.0), tmp_path / "same")
    run_in_process(spec)
    same = _records(tmp_path / "same")
    # zero to float precision: the loss exactly, its gradient ~1e-9 (log_softmax's backward sums the probabilities
    # to 1 - 1e-7); Adam makes that a step of its learning rate's size, so step 2's divergence is ~1e-7
    assert same[0]["train/loss"] == 0.0 and same[0]["train/grad_norm"] < 1e-6
    assert all(r["train/loss"] < 1e-5 for r in same)
    from scaletrain.model.teacher import check_teacher
    from scaletrain.model.tokenizer import load_tokenizer

    assert check_teacher(str(teacher), load_tokenizer(str(student))) == (
        f"teacher: {teacher} (llama, 2 layers), the student's tokenizer")  # said with the data's lines at start

    _, _, spec = local_spec(_cfg(student, teacher, prompts, steps=8, beta=1.0), tmp_path / "other")
    run_in_process(spec)
    losses = [r["train/loss"] for r in _records(tmp_path / "other")]
    assert all(v > 0 for v in losses)
    assert sum(losses[-2:]) < sum(losses[:2]), losses  # the reverse KL to the teacher falls


@pytest.mark.parametrize("change,message", [
    ({"rl": {"teacher_model": None}}, "train.stage=distill scores the student's samples with a teacher and none is "
                                      "given; set rl.teacher_model"),
    ({"rl": {"lmbda": 0.5}}, "rl.lmbda=0.5 (the data's own completions on some steps) is not supported yet"),
    ({"rl": {"seq_kd": True}}, "rl.seq_kd (training on the teacher's samples) is not supported yet"),
    ({"rl": {"beta": 2.0}}, "rl.beta=2 is the generalized JSD's interpolation with train.stage=distill"),
    pytest.param({"rl": {"teacher_model": "VLM"}}, "its tokenizer is not the student's",
                 marks=pytest.mark.slow),  # builds a tiny VLM: make test
])
def test_bad_distillation_input_is_one_line_before_any_worker_starts(models, prompts, tmp_path, change, message):
    from scaletrain.errors import ScaletrainError
    from tests.vlm import save_tiny

    student, teacher = models
    cfg = _cfg(student, teacher, prompts)
    rl = dict(change["rl"])
    if rl.get("teacher_model") == "VLM":  # another tokenizer (Qwen-VL's special tokens added)
        rl["teacher_model"] = str(save_tiny("qwen2_vl", tmp_path / "vlm"))
    cfg["rl"].update(rl)
    with pytest.raises(ScaletrainError) as e:
        local_spec(cfg, tmp_path / "run")
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_plan_counts_the_teacher(models, prompts, tmp_path):
    """The memory estimate holds the teacher's weights beside the student's (its frozen storage, on every rank)."""
    from scaletrain.config import validate
    from scaletrain.memory.estimate import estimate
    from scaletrain.memory.plan import shape_for
    from scaletrain.model.teacher import teacher_parameters
    from scaletrain.model.tokenizer import Vocab, load_tokenizer

    student, teacher = models
    cfg = validate(_cfg(student, teacher, prompts))
    shape = shape_for(cfg, Vocab.of(load_tokenizer(str(student))))
    b = estimate(cfg, shape, 1)
    assert teacher_parameters(str(teacher)) == shape.total > 0
    assert b.reference == shape.total * 4  # fp32 on CPU

"""#62, the first of it: a vision-language model (tiny Qwen2-VL built from config) fine-tuned with LoRA on rows
without images, in-process: the image-text-to-text class loads from its directory, only the language model's
adapter trains (said per part at start), the loss falls and final/ holds the adapter; packing and context
parallelism, not supported yet for these models, are one line before any worker starts."""

import re

import pytest

from scaletrain.launch.local import run_in_process
from tests.conftest import local_spec, train_losses
from tests.vlm import save_tiny

pytestmark = pytest.mark.loop


def _cfg(path, demo_dir, **data):
    return {"model": {"name_or_path": str(path), "task": "causal-lm", "finetuning_type": "lora", "lora_rank": 4},
            "data": {"train_file": str(demo_dir / "alpaca.json"), "max_length": 48, "eval_ratio": 0, **data},
            "train": {"per_device_train_batch_size": 4, "max_steps": 6, "learning_rate": 5e-3, "logging_steps": 2},
            "scaling": {"num_workers": 1}}


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_vision_language_model_trains_its_language_model_on_text_rows(demo_dir, tmp_path):
    path = save_tiny("qwen2_vl", tmp_path / "qwen2-vl")
    _, _, spec = local_spec(_cfg(path, demo_dir), tmp_path / "run")
    run_in_process(spec)
    log = (tmp_path / "run" / "logs" / "main.log").read_text()
    said = re.search(r"([\d,]+) of [\d,]+ parameters trainable.*; vision 0 of \S+ trainable, projector 0 of \S+ "
                     r"trainable, language (\d+) of \S+ trainable", log)
    assert said and int(said.group(1).replace(",", "")) == int(said.group(2)) > 0, log[-600:]  # the adapter only
    losses = train_losses(tmp_path / "run")
    assert losses[-1] < losses[0]
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").is_file()

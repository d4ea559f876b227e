"""The loss of a causal-LM step is the token mean over the whole step, not a mean of micro-batch means."""

import copy

import pytest
import torch

from scaletrain.comm.context import DistContext
from scaletrain.comm.watchdog import Heartbeat
from scaletrain.data import IGNORE_INDEX, Collator, load_split
from scaletrain.worker.step import target_tokens, token_loss_sum, train_step
from scaletrain.worker.trainer import build_trainer
from tests.conftest import local_spec


def _trainer(tmp_path, demo_dir):
    cfg_dict = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
                "data": {"train_file": str(demo_dir / "chat.jsonl"), "formatting": "sharegpt", "eval_ratio": 0.0,
                         "max_length": 96},
                "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 4,
                          "learning_rate": 1e-3, "max_grad_norm": 0.0}}
    cfg, _, spec = local_spec(cfg_dict, tmp_path / "run")
    ctx = DistContext(world_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device="cpu",
                      backend="gloo")
    beat = Heartbeat(spec.run_dir, 0, stall_s=60)
    return build_trainer(ctx, spec, cfg, beat), spec, beat


def test_step_loss_is_the_token_mean_of_the_whole_window(tmp_path, demo_dir):
    t, spec, beat = _trainer(tmp_path, demo_dir)
    data, collate = load_split(spec.train_path), Collator(spec.pad_token_id)
    short = [i for i in range(len(data)) if len(data[i]["input_ids"]) < 50][:2]
    long = [i for i in range(len(data)) if len(data[i]["input_ids"]) > 70][:2]
    window = [collate([data[i] for i in short]), collate([data[i] for i in long])]
    counts = [target_tokens(b) for b in window]
    assert counts[0] != counts[1]  # variable lengths: the two means would weigh tokens differently
    reference = copy.deepcopy(t.model)
    sums = [token_loss_sum(reference(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"])
            for b in window]
    objective = sum(sums) / sum(counts)  # every target token of the step weighs the same
    objective.backward()
    mean_of_means = sum(s / c for s, c in zip(sums, counts)) / 2
    assert abs(objective.item() - mean_of_means.item()) > 1e-5 * objective.item()  # what the old loss optimised
    t.optimizer.step = lambda: None  # keep the weights: compare the gradients of this step
    t.optimizer.zero_grad = lambda set_to_none=True: None
    loss = train_step(t, window, step=1)
    assert loss == pytest.approx(objective.item(), rel=1e-6)
    for (name, p), (_, q) in zip(t.model.named_parameters(), reference.named_parameters()):
        if q.grad is not None:
            assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), name
    beat.close(clean=True)


def test_a_step_without_target_tokens_trains_nothing_and_is_not_nan(tmp_path, demo_dir):
    t, spec, beat = _trainer(tmp_path, demo_dir)
    batch = Collator(spec.pad_token_id)([load_split(spec.train_path)[0]])
    batch["labels"][:] = IGNORE_INDEX
    assert train_step(t, [batch, batch], step=1) == 0.0
    beat.close(clean=True)

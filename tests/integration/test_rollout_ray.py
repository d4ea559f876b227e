"""GRPO with its rollout engine in Ray actors of their own (rollout.placement: separate) on the shared local Ray:
the weight sync gives the engine the trainer's weights bit for bit (the whole model once, then LoRA's adapter only,
its payload the adapter's size), the engine samples what the colocated engine samples, the run trains what the
colocated run trains, and a stuck or killed actor ends a sync in one line naming it, the version and the phase,
within the timeout."""

import contextlib
import json
import math
import random
import time
from pathlib import Path

import pytest
import torch

from scaletrain.config import validate
from scaletrain.errors import TrainingError
from scaletrain.metrics.goodput import CATEGORIES
from scaletrain.metrics.records import read_jsonl
from scaletrain.model.build import build_model, trained_model_config
from scaletrain.model.tokenizer import Vocab
from scaletrain.worker.rollout import Colocated, RolloutPool, sync_payload, tensor_digest
from tests.integration.train_checks import run

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

REWARD = '''
def vowels(prompts, completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]
'''


def _cfg(data, finetuning: str = "lora", placement: str = "separate", **rollout) -> dict:
    return {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": finetuning,
                      "dropout": 0.0},
            "data": {"train_file": str(data), "formatting": "messages", "max_length": 64, "eval_ratio": 0},
            "train": {"stage": "grpo", "per_device_train_batch_size": 8, "max_steps": 3, "learning_rate": 5e-3,
                      "logging_steps": 1},
            "rl": {"reward_funcs": [f"{data.parent / 'rewards.py'}:vowels", "accuracy"], "num_generations": 4,
                   "max_completion_length": 6},
            "rollout": {"placement": placement, **rollout},
            "scaling": {"num_workers": 1}}


def write_sums(folder) -> Path:
    """32 prompts asking a sum (TRL's prompt-only rows with an ``answer``) and rewards.py beside them."""
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}
            for a, b in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(32))]
    path = folder / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rewards.py").write_text(REWARD)
    return path


@pytest.fixture
def sums(tmp_path):
    return write_sums(tmp_path)


def _start(sums, timeout_s: float, run_dir=None):
    """A pool of 2 actors, and the config, tokenizer and vocabulary they were started from."""
    from scaletrain.model.tokenizer import load_tokenizer

    cfg = validate(_cfg(sums))
    tok = load_tokenizer(cfg.model.name_or_path)
    vocab = Vocab.of(tok)
    names = [f"scaletrain-rollout-test-{time.time_ns():x}-{i}" for i in range(2)]
    pool = RolloutPool.start(names, cfg.model_dump(mode="json"), vocab, "cpu", timeout_s, 0, run_dir)
    return pool, cfg, tok, vocab


def _policy(cfg, vocab):
    torch.manual_seed(0)  # another init than the actors': only the sync makes them equal
    return build_model(trained_model_config(cfg.model, cfg.train.stage), vocab)


@pytest.fixture
def pool_and_policy(sums, tmp_path):
    """A LoRA policy built here (the trainer's side) and a pool of 2 actors started from the same config."""
    pool, cfg, tok, vocab = _start(sums, 20.0, str(tmp_path))
    yield pool, _policy(cfg, vocab), tok
    import ray

    for h in pool.handles:
        ray.kill(h)


def _payload(policy, trainable_only: bool) -> dict:
    return sync_payload(policy, full=not trainable_only)


def test_the_sync_gives_the_engine_the_trainers_weights_bit_for_bit_and_never_hangs(pool_and_policy, tmp_path):
    pool, policy, tok = pool_and_policy
    first = pool.sync(0, _payload(policy, False), full=True)
    assert first["kind"] == "full" and first["version"] == 0
    mine = {k: tensor_digest(v) for k, v in _payload(policy, False).items()}
    assert all(d == mine for d in pool.digests())  # the whole model, on both actors
    with torch.no_grad():  # an optimizer step on the adapter
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.01)
    lora = _payload(policy, True)
    adapter_bytes = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    reply = pool.sync(1, lora, full=False)
    assert reply["kind"] == "trainable" and all("lora_" in k for k in lora)
    assert abs(reply["mb"] * 2**20 - adapter_bytes) < 1  # the payload is the adapter's size
    assert all(d == {k: tensor_digest(v) for k, v in _payload(policy, False).items()} for d in pool.digests())
    # both sides log the version: the actors' rollout.jsonl lines (2 actors x 2 syncs)
    logged = read_jsonl(tmp_path / "rollout.jsonl")
    assert sorted((r["actor"], r["version"]) for r in logged) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the engine samples what the policy samples itself from the same random streams
    ids = torch.tensor([[tok.pad_token_id, 5, 6, 7], [8, 9, 10, 11]])
    mask = (ids != tok.pad_token_id).long()
    how = {"max_new_tokens": 6, "eos": tok.eos_token_id, "pad": tok.pad_token_id, "temperature": 1.0, "top_p": 0.9}
    here = Colocated(policy.eval(), "cpu", contextlib.nullcontext)
    (theirs, their_logps), (ours, our_logps) = (e.generate(ids, mask, [3, 4], **how) for e in (pool, here))
    assert torch.equal(theirs, ours) and torch.equal(their_logps, our_logps)

    # the same actors, one stuck, then one killed: each sync ends in one line naming it (one pool for both tests:
    # an actor's start costs seconds)
    pool.timeout_s = 3.0
    names = pool.names
    payload = _payload(policy, False)
    pool.handles[1].hold.remote(60)  # busy: the sync queues behind it
    with pytest.raises(TrainingError, match=rf"rollout actor 1 \({names[1]}\) did not finish the sync \(full "
                                            r"weights\) of version 2 within rollout.sync_timeout_s=3 s"):
        pool.sync(2, payload, full=True)  # (held for 60 s: a sync that waited it out would succeed)
    import ray

    ray.kill(pool.handles[0])  # killed: the wait ends at once, named
    with pytest.raises(TrainingError, match=rf"rollout actor 0 \({names[0]}\) died during the sync \(trainable "
                                            r"tensors\) of version 3"):
        pool.sync(3, payload, full=False)


def test_a_separate_engine_trains_what_the_colocated_one_does_through_a_kill(sums, tmp_path, no_orphans,
                                                                             monkeypatch):
    """The same run with the engine colocated and in an actor of its own, the latter's rank 0 killed at step 4 (its
    actor dies with it): the restarted group starts a new actor and gives it the step-2 checkpoint's weights once
    (the whole model, the adapter copied in: applied once); both sample the same completions at every step and end
    with the same adapter, bit for bit."""
    import os

    from safetensors.torch import load_file

    # a learning rate at which one step changes what the policy samples: a stale engine would sample otherwise
    fast = [_cfg(sums, placement=p) for p in ("separate", "colocated")]
    for c in fast:
        c["train"].update(learning_rate=0.1, max_steps=4)
        c["checkpoint"] = {"save_steps": 2}
    colocated = run(fast[1], tmp_path, "colocated")
    monkeypatch.setitem(os.environ, "SCALETRAIN_FAULTS", "exit:0:4")
    separate = run({**fast[0], "fault_tolerance": {"max_failures": 1}}, tmp_path, "separate")
    log = (separate.run_dir / "logs" / "main.log").read_text()
    assert "failure 1 (max_failures=1)" in log and "resume: from step-2" in log
    a = {r["step"]: r for r in read_jsonl(separate.run_dir / "metrics.jsonl") if r["kind"] == "train"}  # the last
    b = [r for r in read_jsonl(colocated.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    a = [a[s] for s in sorted(a)]
    assert [r["train/loss"] for r in a] == pytest.approx([r["train/loss"] for r in b], abs=1e-6)
    assert [r["reward"] for r in a] == [r["reward"] for r in b]  # the same completions
    assert len({r["reward"] for r in a}) == 4  # the policy moved
    assert [r["rollout/version"] for r in a] == [0, 1, 2, 3] and "rollout/version" not in b[0]
    synced = [(r["version"], r["kind"]) for r in read_jsonl(separate.run_dir / "rollout.jsonl")]
    assert synced == [(0, "full"), (1, "trainable"), (2, "trainable"), (2, "full"), (3, "trainable")]
    x, y = (load_file(r.run_dir / "final" / "adapter_model.safetensors") for r in (colocated, separate))
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert all(r["time/sync_s"] > 0 and r["time/rollout_s"] > 0 for r in a)
    summary = json.loads((separate.run_dir / "summary.json").read_text())
    parts = [summary[f"goodput/{c}_s"] for c in CATEGORIES]  # the account adds up, the syncs a category of it
    assert sum(parts) == pytest.approx(summary["goodput/wall_s"], rel=0.01)
    assert summary["goodput/sync_s"] > 0


def test_staleness_one_samples_the_next_step_while_this_one_trains_within_the_bound(sums, tmp_path, no_orphans,
                                                                                   monkeypatch):
    """#74, rollout.max_staleness=1 (verl's one-step-off) on 1 trainer + 1 actor: the first step samples at once,
    every later step trains completions its actor sampled during the step before, by the weights one optimizer step
    older (the lag of everything trained <= 1; nothing dropped); the sampler's correction (TRL's sequence_mask,
    its default) is applied and logged by TRL's names; the actors' log shows each sync before the rollout it
    serves. The policy calls tools (tests/tool_model.py: rl.tools and rl.environment): the rounds after a call are
    sampled by the actor too, when the step collects its first turns. Killed at step 4 with step 3's rollouts in
    flight at its step-2 checkpoint, the run resumes and trains what the uninterrupted one trains (the checkpoint
    keeps them)."""
    import os

    from tests.tool_model import tool_caller

    model = tool_caller(tmp_path / "caller")
    cfg = _cfg(sums)
    cfg["model"]["name_or_path"] = str(model)
    cfg["data"]["max_length"] = 2048
    cfg["rl"].update(tools=[f"{model}/tools.py:add"], environment=f"{model}/tools.py:Counter",
                     max_completion_length=48, max_tool_calling_iterations=2)
    cfg["rollout"]["max_staleness"] = 1
    cfg["train"].update(max_steps=4, learning_rate=0.05)
    cfg["checkpoint"] = {"save_steps": 2}
    done = run(cfg, tmp_path, "async")
    records = [r for r in read_jsonl(done.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["tools/call_frequency"] > 0 and "rewards/Counter/mean" in r for r in records)
    assert "<tool_response>" in (done.run_dir / "samples.jsonl").read_text()  # a round after the replies
    assert [r["rollout/staleness_mean"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["rollout/staleness_max"] <= 1 and r["rollout/stale_dropped"] == 0 for r in records)
    assert all(0 < r["sampling/importance_sampling_ratio/mean"] for r in records)
    assert all(r["sampling/importance_sampling_ratio/min"] <= r["sampling/importance_sampling_ratio/mean"]
               <= r["sampling/importance_sampling_ratio/max"] for r in records)
    started = (done.run_dir / "logs" / "main.log").read_text()  # the start line says what overlaps
    assert "the next 1 step(s)' prompts are sampled while a step trains" in started
    synced = [r["version"] for r in read_jsonl(done.run_dir / "rollout.jsonl")]
    assert synced == [0, 1, 2]  # step 1: v0 (its rollout and step 2's); step 2 sends step 3's with v1; step 3: v2
    assert all(math.isfinite(r["train/loss"]) for r in records)
    monkeypatch.setitem(os.environ, "SCALETRAIN_FAULTS", "exit:0:4")
    killed = run({**cfg, "fault_tolerance": {"max_failures": 1}}, tmp_path, "async-killed")
    assert "resume: from step-2" in (killed.run_dir / "logs" / "main.log").read_text()
    again = {r["step"]: r for r in read_jsonl(killed.run_dir / "metrics.jsonl") if r["kind"] == "train"}
    assert [again[s]["train/loss"] for s in (1, 2, 3, 4)] == [r["train/loss"] for r in records]
    assert [again[s]["reward"] for s in (1, 2, 3, 4)] == [r["reward"] for r in records]

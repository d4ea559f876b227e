"""rollout.engine: vllm with a fake ``vllm`` module (vLLM is GPU-only): what scaletrain asks of vLLM's offline API
(the LLM's settings, a seed per request, the stop token, LoRA as a new LoRARequest per version written by peft,
full weights through the worker's model, memory handed back between rollouts) and what it makes of the answers."""

import random
import sys
import types

import pytest
import torch

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.model.build import build_model, trained_model_config
from scaletrain.model.tokenizer import Vocab, load_tokenizer


class FakeLLM:
    made: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], []
        FakeLLM.made.append(self)

    def generate(self, prompts, sampling_params, use_tqdm, lora_request):
        self.calls.append(("generate", prompts, sampling_params, lora_request))
        outs = []
        for p in sampling_params:  # a row's tokens from its own seed: the same seed, the same completion
            rng = random.Random(p.kwargs["seed"])
            ids = [rng.randrange(3, 50) for _ in range(rng.randrange(1, p.kwargs["max_tokens"] + 1))]
            if rng.random() < 0.5:
                ids[-1] = p.kwargs["stop_token_ids"][0]
            logprobs = [{tok: types.SimpleNamespace(logprob=-0.5 - k)} for k, tok in enumerate(ids)]
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outs

    def apply_model(self, fn):
        fake = types.SimpleNamespace(load_weights=lambda weights: self.loaded.append(list(weights)))
        return [fn(fake)]

    def reset_prefix_cache(self):
        self.calls.append(("reset",))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake",))


class Params:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class LoRARequest:
    def __init__(self, name, int_id, path):
        self.name, self.int_id, self.path = name, int_id, path


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, Params
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    FakeLLM.made.clear()
    return vllm


def _engine(finetuning: str, tmp_path):
    from scaletrain.worker.vllm_engine import VLLMEngine

    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm",
                              "finetuning_type": finetuning, "lora_rank": 4},
                    "data": {"train_file": "x.jsonl"}})
    policy = build_model(trained_model_config(cfg.model, "sft"), Vocab.of(load_tokenizer(cfg.model.name_or_path)))
    from scaletrain.worker.vllm_engine import lora_rank_of

    rank = lora_rank_of(policy) if finetuning == "lora" else None
    return VLLMEngine(str(tmp_path / "model"), rank, cfg.rollout, 7, 96, "bfloat16", policy=policy), policy


def test_lora_goes_to_vllm_as_a_new_adapter_per_version(fake_vllm, tmp_path):
    engine, policy = _engine("lora", tmp_path)
    llm = FakeLLM.made[0]
    assert llm.kwargs["enable_lora"] and llm.kwargs["max_lora_rank"] == 4 and llm.kwargs["max_loras"] == 1
    assert llm.kwargs["gpu_memory_utilization"] == 0.3 and llm.kwargs["max_model_len"] == 96
    assert llm.kwargs["dtype"] == "bfloat16" and llm.kwargs["seed"] == 7 and llm.kwargs["enable_sleep_mode"]
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"  # after the temperature, as the trainer's
    assert llm.kwargs["distributed_executor_backend"] == "external_launcher"  # in the worker's process
    first = engine.load(0, full=True)
    path0 = engine.request.path
    from safetensors.torch import load_file

    saved = load_file(f"{path0}/adapter_model.safetensors")
    adapter = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    assert all("lora_" in k for k in saved) and sum(v.numel() * v.element_size() for v in saved.values()) == adapter
    assert first["kind"] == "lora" and first["mb"] * 2**20 < adapter * 1.2 + 4096  # the adapter, not the model
    engine.load(1, full=False)
    assert engine.request.int_id == 2 and engine.request.path != path0 and engine.version == 1
    import os

    assert not os.path.exists(path0)  # the last version's adapter is not kept
    assert llm.loaded == []  # the base is never reloaded, the adapter never merged


def test_a_full_fine_tune_loads_the_whole_state_by_transformers_names(fake_vllm, tmp_path):
    engine, policy = _engine("full", tmp_path)
    engine.load(3, full=True)
    llm = FakeLLM.made[0]
    names = [n for n, _ in llm.loaded[0]]
    assert names == list(policy.state_dict()) and not any(n.startswith("base_model") for n in names)
    assert ("reset",) in llm.calls and engine.version == 3 and "enable_lora" not in llm.kwargs


def test_each_row_is_sampled_with_its_own_seed_and_the_memory_is_handed_back(fake_vllm, tmp_path):
    engine, _ = _engine("lora", tmp_path)
    engine.load(0, full=True)
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out, logps = engine.generate(ids, mask, [11, 12], max_new_tokens=6, eos=2, pad=0, temperature=0.7, top_p=0.9)
    llm = FakeLLM.made[0]
    _, prompts, params, request = next(c for c in llm.calls if c[0] == "generate")
    assert prompts == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7, 8, 9, 10]}]  # the padding left out
    assert [p.kwargs["seed"] for p in params] == [11, 12] and request is engine.request
    assert all(p.kwargs["stop_token_ids"] == [2] and p.kwargs["temperature"] == 0.7 and p.kwargs["top_p"] == 0.9
               and p.kwargs["max_tokens"] == 6 and p.kwargs["logprobs"] == 0 for p in params)
    n = int((out[0] != 0).sum())
    assert logps[0, :n].tolist() == [-0.5 - k for k in range(n)]  # the sampled token's, at each position
    again, _ = engine.generate(ids.flip(0), mask.flip(0), [12, 11], max_new_tokens=6, eos=2, pad=0)
    rows = [r[r != 0].tolist() for r in out]
    assert rows == [r[r != 0].tolist() for r in again.flip(0)]  # a row's completion is its seed's, wherever it sits
    assert llm.calls[-1] == ("sleep", 1) and ("wake",) in llm.calls  # asleep between rollouts


def test_vllm_is_refused_in_one_line_where_it_cannot_run(monkeypatch):
    from scaletrain.worker import vllm_engine

    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="rollout.engine=vllm: vLLM is not installed on this worker"):
        vllm_engine.check_vllm("cuda:0")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    with pytest.raises(ConfigError, match="rollout.engine=vllm needs a GPU and this worker runs on cpu"):
        vllm_engine.check_vllm("cpu")
    base = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"}, "data": {"train_file": "x.jsonl"},
            "train": {"stage": "grpo", "per_device_train_batch_size": 8},
            "rl": {"reward_funcs": ["accuracy"], "num_generations": 4}, "rollout": {"engine": "vllm"}}
    with pytest.raises(Exception, match="model.name_or_path=builtin:tiny-llama is built from a config"):
        validate(base)
    with pytest.raises(Exception, match="rollout.engine=vllm with train.strategy=fsdp is not supported yet"):
        validate({**base, "train": {**base["train"], "strategy": "fsdp"}})


def test_a_rollout_actor_runs_vllm_on_the_trainers_adapter_files(fake_vllm, tmp_path, monkeypatch):
    """rollout.placement: separate with vLLM: the actor (worker/rollout.py's RolloutWorker, here in this process)
    starts vLLM from the model directory, takes the adapter as the files peft writes (what the trainer sends),
    writes its version to rollout.jsonl, and samples with a seed per row."""
    import json

    from scaletrain.model.files import TINY_LLAMA
    from scaletrain.worker import vllm_engine
    from scaletrain.worker.rollout import RolloutWorker
    from scaletrain.worker.vllm_engine import payload_of

    monkeypatch.setattr(vllm_engine, "check_vllm", lambda device: None)  # a GPU, as the actor would have
    tok = load_tokenizer(TINY_LLAMA)
    base = validate({"model": {"name_or_path": TINY_LLAMA, "task": "causal-lm"}, "data": {"train_file": "x.jsonl"}})
    build_model(base.model, Vocab.of(tok)).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = validate({"model": {"name_or_path": str(tmp_path / "model"), "task": "causal-lm",
                              "finetuning_type": "lora", "lora_rank": 4},
                    "data": {"train_file": "x.jsonl", "max_length": 32},
                    "train": {"stage": "grpo", "per_device_train_batch_size": 4},
                    "rl": {"reward_funcs": ["accuracy"], "num_generations": 4, "max_completion_length": 8},
                    "rollout": {"engine": "vllm", "placement": "separate"}})
    actor = RolloutWorker(0, cfg.model_dump(mode="json"), Vocab.of(tok), "cuda", 1, str(tmp_path))
    llm = FakeLLM.made[0]
    assert llm.kwargs["model"] == str(tmp_path / "model") and llm.kwargs["max_lora_rank"] == 4
    assert llm.kwargs["distributed_executor_backend"] == "uni"  # no process group in an actor
    assert llm.kwargs["max_model_len"] == 40  # the prompt's budget and the completion's
    policy = build_model(trained_model_config(cfg.model, "grpo"), Vocab.of(tok))
    files = payload_of(policy, lora=True)
    assert "adapter_model.safetensors" in files and "adapter_config.json" in files
    done = actor.load(0, files, full=True)
    assert done["kind"] == "lora" and done["mb"] * 2**20 == sum(len(b) for b in files.values())
    tokens, logps = actor.generate(0, torch.tensor([[5, 6]]), torch.tensor([[1, 1]]), [3],
                                   {"max_new_tokens": 4, "eos": 2, "pad": 0})
    assert tokens.shape[0] == 1 and logps.shape == tokens.shape
    assert [json.loads(ln)["version"] for ln in (tmp_path / "rollout.jsonl").read_text().splitlines()] == [0]


def test_vllm_on_workers_of_this_machine_without_a_gpu_is_refused_before_they_start(monkeypatch):
    from scaletrain.rl import rewards

    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": "x.jsonl"}, "train": {"stage": "grpo", "per_device_train_batch_size": 8},
                    "rl": {"reward_funcs": ["accuracy"], "num_generations": 4}, "scaling": {"launcher": "torchrun"}})
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "vllm"})})
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    with pytest.raises(ConfigError, match="rollout.engine=vllm needs a GPU and scaling.launcher=torchrun runs the "
                                          "workers on this machine, which has none"):
        rewards.check(cfg)

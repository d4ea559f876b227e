"""``rollout.engine: vllm`` (GPUs; the ``vllm`` extra): the completions sampled by vLLM in each training worker
(``rollout.placement: colocated``, as TRL's ``vllm_mode: colocate``), its memory handed back between rollouts.

vLLM is its own engine, not the policy: after every optimizer step it is given the policy (``load``) with a version,
as the separate engine is. Full fine-tuning: the whole state through the model's ``load_weights`` (transformers'
names; what verl and TRL call). LoRA: only the adapter, written with peft's ``save_pretrained`` (a few MB) and
handed to vLLM as a new ``LoRARequest`` per version (vLLM's own LoRA path: the base stays as loaded, the adapter is
never merged into it, so it cannot be applied twice). Each row is sampled with a seed of its own
(``SamplingParams.seed``: vLLM's per-request seed), the same seeds as the hf engine's streams, so 1 and N workers
sample the same completions with vLLM too (vLLM's sampler is not transformers', so not the hf engine's tokens).

Written against vLLM's documented offline API (``LLM``, ``SamplingParams``, ``LoRARequest``, ``apply_model``,
``sleep`` / ``wake_up``); tested here with a fake ``vllm`` module (no GPU); benchmarks/gpu_check.sh runs it on a GPU
where vLLM is installed.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import torch

from scaletrain.errors import ConfigError

log = logging.getLogger(__name__)


def check_vllm(device: str) -> None:
    """On the worker: vLLM is installed and this worker has a GPU, or one line."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine=vllm: vLLM is not installed on this worker (pip install 'scaletrain[vllm]' "
                          "on a GPU machine), or use rollout.engine: hf")
    if not str(device).startswith("cuda"):
        raise ConfigError(f"rollout.engine=vllm needs a GPU and this worker runs on {device}; use rollout.engine: "
                          f"hf (transformers' generate runs on CPUs too)")


class VLLMEngine:
    """One vLLM, loaded from the run's model directory, kept current by ``load`` (a training worker's, from the
    policy it trains: ``policy``) or ``load_payload`` (a rollout actor's, from what the trainer sent)."""

    placement = "colocated"

    def __init__(self, model_dir: str, lora_rank: int | None, rollout, seed: int, max_len: int, dtype: str,
                 policy=None, executor: str = "external_launcher"):
        """``executor``: vLLM's distributed_executor_backend: external_launcher in a training worker (vLLM in the
        worker's own process beside torch.distributed, one engine per rank, as TRL's colocate mode), uni in a
        rollout actor (no process group there)."""
        from vllm import LLM

        self.policy, self.lora, self.version = policy, lora_rank is not None, None
        self.adapters = Path(tempfile.mkdtemp(prefix="scaletrain-vllm-lora-"))
        self.request = None
        extra = {"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 1} if self.lora else {}
        # processed_logprobs: the sampled tokens' log-probabilities after the temperature, as the trainer's
        self.llm = LLM(model=model_dir, dtype=dtype, seed=seed, max_model_len=max_len,
                       logprobs_mode="processed_logprobs", gpu_memory_utilization=rollout.gpu_memory_utilization,
                       enable_sleep_mode=True, distributed_executor_backend=executor, **extra)
        self.asleep = False

    def load(self, version: int, full: bool) -> dict:
        """The policy as it is now: the adapter (LoRA) or the whole state (full fine-tuning)."""
        return self.load_payload(version, payload_of(self.policy, self.lora))

    def load_payload(self, version: int, payload: dict) -> dict:
        """LoRA: ``payload`` is the adapter's files (peft's ``save_pretrained``: name -> bytes), given to vLLM as a
        new LoRARequest; full fine-tuning: the state by transformers' names, through the model's ``load_weights``."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        self.wake()
        if self.lora:
            path = self.adapters / f"v{version}"
            path.mkdir()
            for name, data in payload.items():
                (path / name).write_bytes(data)
            self.request = LoRARequest(f"scaletrain-v{version}", version + 1, str(path))
            size = sum(len(data) for data in payload.values())
            for old in self.adapters.iterdir():  # the versions before this one are not read again
                if old != path:
                    _remove(old)
        else:
            weights = list(payload.items())
            # vLLM's documented hook into its worker's model (in this process: external_launcher); the model's
            # load_weights takes transformers' names, as verl and TRL call it
            self.llm.apply_model(lambda model: model.load_weights(weights=weights))
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
            size = sum(v.numel() * v.element_size() for v in payload.values())
        self.version = version
        reply = {"version": version, "kind": "lora" if self.lora else "full", "mb": size / 2**20,
                 "load_s": time.perf_counter() - t0}
        log.info("vllm engine: weights version %d (%s, %.3f MB)", version, reply["kind"], reply["mb"])
        return reply

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, seeds: list[int], max_new_tokens: int, eos: int,
                 pad: int, temperature: float = 1.0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """[rows, <= max_new_tokens] sampled tokens, ``pad`` after a row's EOS, and their log-probabilities as vLLM
        reports them (the hf engine's shapes)."""
        from vllm import SamplingParams

        self.wake()
        prompts = [{"prompt_token_ids": row[m.bool()].tolist()} for row, m in zip(ids.cpu(), mask.cpu())]
        params = [SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=s, logprobs=0,
                                 stop_token_ids=[eos], skip_special_tokens=False) for s in seeds]
        outs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False, lora_request=self.request)
        rows = [list(o.outputs[0].token_ids) for o in outs]
        width = max((len(r) for r in rows), default=0)
        out = torch.full((len(rows), width), pad, dtype=torch.long)
        logps = torch.zeros((len(rows), width))
        for i, (r, o) in enumerate(zip(rows, outs)):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            # logprobs=0: each position's dict holds the sampled token's Logprob
            chosen = [float(pos[tok].logprob) for tok, pos in zip(r, o.outputs[0].logprobs or [])]
            logps[i, :len(chosen)] = torch.tensor(chosen)
        self.sleep()  # the training phase gets the memory back
        return out, logps

    def sleep(self) -> None:
        """vLLM's weights and KV cache off the GPU until the next rollout (sleep level 1: the weights to host memory:
        LoRA's base stays; a full fine-tune's are replaced at the next load anyway)."""
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def payload_of(policy, lora: bool) -> dict:
    """What a vLLM engine is given of ``policy``: LoRA's adapter as peft writes it (its files: name -> bytes, a few
    MB), or the whole state by transformers' names (where the policy is: vLLM in the same process takes them
    there)."""
    if not lora:
        return {k: v.detach() for k, v in policy.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="scaletrain-adapter-") as tmp:
        policy.save_pretrained(tmp)  # peft: the adapter's tensors and config only
        return {f.name: f.read_bytes() for f in Path(tmp).iterdir() if f.is_file()}


def vllm_dtype(compute: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16"}.get(compute, "float32")


def lora_rank_of(policy) -> int:
    config = getattr(policy, "peft_config", {}).get("default")
    return int(getattr(config, "r", 16))


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)

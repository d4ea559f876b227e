"""A GRPO micro-batch's completions, around the engine (worker/grpo.py asks, worker/rollout.py samples): the
request the engine gets (each prompt left-padded, each row's seed, how to sample), the first turns cut from what it
answered, the completion batch the loss trains on, and the log-probabilities of completion tokens under a model.

Each row draws from a random stream of its own: its prompt's seed (the run's seed, the step and the prompt's index in
the split: ``prompt_seed``) plus its place in the group, so 1 and N workers, and a resumed run, sample the same
completions whatever else shares the micro-batch."""

from __future__ import annotations

import hashlib
import json

import torch
import torch.nn.functional as F

from scaletrain.rl.sampling import left_padded
from scaletrain.worker.tool_rollouts import Conversation, trained_mask


def prompt_seed(seed: int, step: int, prompt_index: int) -> int:
    """The sampling seed of one prompt's group at one step (a stable hash, not Python's per-process one)."""
    digest = hashlib.sha256(f"{seed}:{step}:{prompt_index}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def request_for(batch: dict, step: int, cfg, eos: int, pad: int) -> dict:
    """What the engine is asked for a micro-batch: its prompts left-padded, each row's seed, how to sample."""
    rl = cfg.rl
    extras = [json.loads(e) for e in batch["extra"]]
    lengths = batch["attention_mask"].sum(-1).tolist()
    prompts = [batch["input_ids"][i, :lengths[i]].tolist() for i in range(batch["input_ids"].shape[0])]
    ids, mask = left_padded(prompts, pad)  # every row's completion starts at the same column
    seeds = [prompt_seed(cfg.train.seed, step, int(batch["prompt_index"][i])) + i % rl.num_generations
             for i in range(len(prompts))]
    how = dict(max_new_tokens=rl.max_completion_length, eos=eos, pad=pad, temperature=rl.temperature, top_p=rl.top_p)
    return {"ids": ids, "mask": mask, "seeds": seeds, "how": how, "prompts": prompts, "extras": extras}


def first_turns(request: dict, out: torch.Tensor, sampled: torch.Tensor, cap: int) -> list[Conversation]:
    """Each row's answer through its first EOS (truncated at ``cap`` without one), with its sampling
    log-probabilities."""
    eos = request["how"]["eos"]
    rows = []
    for p, seed, row, logps in zip(request["prompts"], request["seeds"], out.tolist(), sampled):
        ended = eos in row
        row = row[:row.index(eos) + 1] if ended else row[:cap]
        rows.append(Conversation(p, seed, row, logps[:len(row)].float().cpu().tolist(), not ended))
    return rows


def completion_batch(rows: list[Conversation], pad: int, mask_truncated: bool) -> dict:
    """The tensors the loss reads (prompt + completion right-padded, each completion's trained tokens, where it
    starts, the sampler's log-probabilities) and the completions' tokens."""
    width = max(len(c.prompt) + max(len(c.tokens), 1) for c in rows)
    c_width = max(max(len(c.tokens) for c in rows), 1)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    sampling_logps = torch.zeros((len(rows), c_width), dtype=torch.float32)  # the engine's, of the same tokens
    for i, c in enumerate(rows):
        ids[i, :len(c.prompt) + len(c.tokens)] = torch.tensor(c.prompt + c.tokens)
        sampling_logps[i, :len(c.tokens)] = torch.tensor(c.logps, dtype=torch.float32)
        mask[i, :len(c.prompt) + len(c.tokens)] = 1
    return {"input_ids": ids, "attention_mask": mask, "completion_mask": trained_mask(rows, c_width, mask_truncated),
            "starts": torch.tensor([len(c.prompt) for c in rows]), "sampling_logps": sampling_logps,
            "completion_ids": [c.tokens for c in rows], "truncated": [c.truncated for c in rows]}


def completion_logps(logits: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, width: int,
                     with_entropy: bool = False, temperature: float = 1.0):
    """Each row's log-probabilities of its completion tokens ([B, width]: token j of row i is at starts[i] + j, its
    logit one place before) in fp32, of the logits divided by the sampling temperature (TRL's, for the policy, the
    old policy and the reference alike); with its entropies."""
    rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    where = (starts.to(ids.device).unsqueeze(1) + torch.arange(width, device=ids.device)).clamp(max=ids.shape[1] - 1)
    picked = logits[rows, where - 1].float() / temperature  # [B, width, V]
    logp = F.log_softmax(picked, dim=-1)
    token_logps = logp.gather(-1, ids[rows, where].unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return token_logps
    return token_logps, -(logp.exp() * logp).sum(-1)

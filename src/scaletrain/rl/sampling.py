"""Sampling a batch of completions where each row draws from a random stream of its own.

transformers' ``generate`` samples every row of a batch with one ``torch.multinomial`` call on the global generator,
so a row's tokens depend on which other rows share its batch. GRPO's completions must not: 1 and N workers hold
different micro-batches (per-device batches differ) and must sample the same completions, and a resumed run the
same as an uninterrupted one. Seeding one ``generate`` call per prompt does that but runs the model once per group;
this loop runs the whole micro-batch through the model at once (left-padded prompts, a KV cache, the position ids
from the attention mask as ``generate`` does) and draws each row's token from that row's own ``torch.Generator``,
with temperature and top-p applied as transformers' warpers do."""

from __future__ import annotations

import torch


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside the smallest set whose probability reaches ``top_p`` set to -inf (at least one kept), as
    transformers' TopPLogitsWarper."""
    if top_p >= 1.0:
        return logits
    ordered, index = torch.sort(logits, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(-1, index, remove), float("-inf"))


@torch.no_grad()
def sample(model, ids: torch.Tensor, mask: torch.Tensor, generators: list[torch.Generator], max_new_tokens: int,
           eos: int, pad: int, temperature: float = 1.0, top_p: float = 1.0, all_done=None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, <= max_new_tokens] sampled tokens after left-padded ``ids`` (a row is ``pad`` after its EOS), and each
    drawn token's log-probability under the sampling distribution before top-p (fp32 log-softmax of the logits /
    temperature: what the trainer computes for the same tokens, compared in ``sampling/sampling_logp_difference``).
    ``all_done``: whether every rank's rows are done, given this rank's (a collective): a model sharded by FSDP
    runs its forwards together on every rank, so no rank may stop sampling before the others."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    tokens, logps = [], []
    for _ in range(max_new_tokens):
        scaled = logits.float() / temperature
        probs = top_p_filter(scaled, top_p).softmax(dim=-1)
        drawn = torch.cat([torch.multinomial(probs[i].cpu() if g.device.type == "cpu" else probs[i], 1, generator=g)
                           for i, g in enumerate(generators)]).to(ids.device)
        drawn = torch.where(done, torch.full_like(drawn, pad), drawn)
        tokens.append(drawn)
        logps.append(scaled.log_softmax(dim=-1).gather(-1, drawn.unsqueeze(-1)).squeeze(-1))
        done |= drawn == eos
        finished = bool(done.all())
        if all_done is not None:
            finished = all_done(finished)
        if finished:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=drawn.unsqueeze(1), attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    if not tokens:
        return ids.new_zeros((ids.shape[0], 0)), torch.zeros((ids.shape[0], 0))
    return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows left-padded into one batch (every row's next token at the same column) and its attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask

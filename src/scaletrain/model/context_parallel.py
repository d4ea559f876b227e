"""Context parallelism: each sequence of a batch split over the ``N`` ranks of a context-parallel group.

Every rank of a group gets the same batch (the data-parallel rank is ``rank // N``) and keeps 1/N of its
positions, so activations per rank shrink ~N-fold; only attention needs the other ranks' positions:

- **ulysses** (DeepSpeed-Ulysses): an all-to-all before attention trades the sequence split for a head split
  (each rank then holds every position of H/N heads), attention runs over whole sequences, and an all-to-all
  after it trades back. Needs the query heads divisible by N; key/value heads that are not are replicated to
  one per query head first (said at start).
- **ring** (here an all-gather of keys and values, Llama 3's choice for few KV heads, arXiv 2407.21783 §3.3.2):
  each rank keeps its queries and gathers every rank's keys and values; any head count. Because the whole K/V
  is present no log-sum-exp merge of partial results is needed; a ring that passes K/V blocks round and merges
  would hold 2/N of them instead of all, at N-1 sequential steps (not written yet: the gather is exact and the
  tests compare it with one rank).

The split is zig-zag (ring-flash-attention's and torchtitan's load balance for causal attention): the row is cut
into 2N chunks and rank r holds chunks r and 2N-1-r, so every rank has an early and a late chunk and does the
same attention work. Labels are shifted to next-token targets *before* the split (the last position of a shard
predicts the first token of the next chunk, on another rank), and the loss sums target tokens on every rank and
divides by the global target count over data x context parallel ranks (worker/step.py), so CP N trains the
same objective as CP 1. Packed rows keep per-example attention: a token attends to earlier positions of its own
example only, on every rank, read from the whole row's position ids (every rank of the group has them).

Written here rather than taken from torch's ``context_parallel`` (experimental, FlexAttention/SDPA-buffer based
and not a transformers attention function) or ring-flash-attn (CUDA-only kernels): this is a transformers
``AttentionInterface`` function, so every SDPA model of transformers takes it with no model code changed, and it
runs on gloo for the CPU tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.errors import ConfigError
from scaletrain.model.attention import causal_over_spans

NAME = "scaletrain_context_parallel"
METHODS = ("auto", "ulysses", "ring")


def choose_method(asked: str, heads: int, size: int) -> str:
    """``scaling.context_parallel_method`` resolved for a model with ``heads`` query heads."""
    if asked == "ulysses" and heads % size:
        raise ConfigError(f"scaling.context_parallel_method=ulysses: the model's {heads} attention heads do not "
                          f"divide into scaling.context_parallel={size} groups; set context_parallel_method: ring "
                          f"(any head count) or a context_parallel that divides {heads}")
    if asked == "auto":
        return "ulysses" if heads % size == 0 else "ring"
    return asked


def shard_index(width: int, size: int, rank: int) -> torch.Tensor:
    """Positions of a ``width``-long row (a multiple of 2 x size) that rank ``rank`` holds: chunks r and 2N-1-r."""
    chunk = width // (2 * size)
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk),
                      torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk)])


def padded_width(width: int, size: int) -> int:
    step = 2 * size
    return -(-width // step) * step


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Next-token targets: position t is trained to predict labels[t + 1]; the last position predicts nothing."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)


def shard_batch(batch: dict, size: int, rank: int, pad_id: int = 0) -> dict:
    """This rank's share of a causal-LM batch: labels shifted first (``shift_labels``), the row padded to a
    multiple of 2 x size (padding: no target), then the zig-zag positions of input ids, targets and position ids.
    The whole row's position ids stay with the batch (``cp_positions``) for the attention's example bounds."""
    ids = batch["input_ids"]
    rows, width = ids.shape
    positions = batch.get("position_ids")
    if positions is None:  # padded rows: right padding, so a causal token never sees the padding after it
        positions = torch.arange(width, device=ids.device).expand(rows, width)
    targets = shift_labels(batch["labels"])
    full = padded_width(width, size)
    mask = batch.get("attention_mask")
    if full > width:
        extra = full - width
        ids = F.pad(ids, (0, extra), value=pad_id)
        targets = F.pad(targets, (0, extra), value=IGNORE_INDEX)
        mask = F.pad(mask, (0, extra), value=0) if mask is not None else None
        positions = torch.cat([positions, positions[:, -1:] + 1 + torch.arange(extra, device=ids.device)], dim=1)
    index = shard_index(full, size, rank).to(ids.device)
    out = {k: v for k, v in batch.items() if k not in ("input_ids", "labels", "position_ids", "attention_mask")}
    out.update(input_ids=ids[:, index], shift_labels=targets[:, index], position_ids=positions[:, index].contiguous(),
               cp_positions=positions.contiguous())
    if mask is not None:  # the shard's padding, for what counts real tokens (an MoE router); attention ignores it
        out["attention_mask"] = mask[:, index]
    return out


@dataclass(frozen=True)
class Group:
    """This rank's context-parallel group."""

    size: int
    rank: int
    group: object  # torch.distributed ProcessGroup
    method: str  # "ulysses" | "ring"


_state: dict = {}  # the group, and the positions of the batch in flight (set before its forward; read again by
# activation checkpointing's recompute during backward, so it is not cleared after the forward)


def install(model, group: Group) -> None:
    """Make a transformers model's attention context-parallel over ``group``; an error naming the model when its
    attention is not SDPA-based."""
    config = model.config
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ("sdpa", NAME, "scaletrain_sdpa_by_example"):
        raise ConfigError(f"scaling.context_parallel={group.size}: {type(model).__name__} runs attention "
                          f"'{impl}', not SDPA; context parallelism replaces SDPA attention only: set "
                          f"scaling.context_parallel: 1")
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _no_mask)
    model.set_attn_implementation(NAME)
    _state["group"] = group


def set_batch(batch: dict) -> None:
    """The sharded batch about to run forward (``shard_batch``'s output): where its positions are in the row."""
    g: Group = _state["group"]
    full = batch["cp_positions"]
    width = full.shape[1]
    local = shard_index(width, g.size, g.rank).to(full.device)
    gathered = torch.cat([shard_index(width, g.size, r) for r in range(g.size)]).to(full.device)
    example = (full == 0).cumsum(dim=1)  # which example of the row each position belongs to
    # the examples' bounds, read once per batch here (one host sync), not in every layer
    plain = bool((example == example[:, :1]).all())
    bounds = [[0, width]] if plain else [
        torch.nonzero(torch.diff(row, prepend=row[:1] - 1)).flatten().tolist() + [width] for row in example]
    _state.update(local=local, gathered=gathered, example=example, order=torch.argsort(gathered), bounds=bounds)
    _state["blocks"] = _blocks(g, bounds, width) if g.method == "ring" else None


def _no_mask(*args, **kwargs):
    return None  # the attention builds its own from the row's positions


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              **kwargs):
    """transformers' attention-function signature, over this rank's shard: query (batch, heads, L, dim),
    key/value (batch, kv heads, L, dim); returns (batch, L, heads, dim)."""
    if (not getattr(module, "is_causal", True) or getattr(module, "sliding_window", None)
            or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None):
        raise ConfigError(f"scaling.context_parallel: {type(module).__name__} uses a sliding window, soft-capping "
                          f"or attention sinks, which the context-parallel attention does not compute; set "
                          f"scaling.context_parallel: 1")
    g: Group = _state["group"]
    if g.method == "ulysses":
        out = _ulysses(query, key, value, g, dropout, scaling)
    else:
        out = _gathered_kv(query, key, value, g, dropout, scaling)
    return out.transpose(1, 2).contiguous(), None


def _gathered_kv(query, key, value, g: Group, dropout, scaling):
    keys = _AllGather.apply(key.contiguous(), g.group, g.size)  # (B, kv heads, N x L, dim), rank-major
    values = _AllGather.apply(value.contiguous(), g.group, g.size)
    order = _state["order"]
    keys, values = keys[:, :, order], values[:, :, order]  # the row's order
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if dropout == 0.0 and _blockwise_kernel(query) is not None:
        return _BlockAttention.apply(query, keys, values, _state["blocks"], scale)
    # a kernel without a log-sum-exp to merge (fp32 on a GPU, dropout): one masked call, which keeps an L x S mask
    q_at, k_at, example = _state["local"], torch.arange(keys.shape[2], device=query.device), _state["example"]
    allowed = (k_at[None, :] <= q_at[:, None])[None] & (example[:, None, :] == example[:, q_at][:, :, None])
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed[:, None], dropout_p=dropout,
                                          scale=scale, enable_gqa=query.shape[1] != keys.shape[1])


def _blocks(g: Group, bounds: list[list[int]], width: int) -> list[tuple[slice, slice, list[tuple[slice, bool]]]]:
    """The ring's work as blocks: for each run of this rank's queries inside one chunk and one example (rows: all
    of the batch when no row is packed, else one; ``bounds``: each row's example starts and its width), the keys
    it attends: the example's earlier positions (no mask) and its own run (causal), by position in the row."""
    chunk = width // (2 * g.size)
    chunks = [(g.rank * chunk, 0), ((2 * g.size - 1 - g.rank) * chunk, chunk)]  # (row start, local start)
    rows = [slice(None)] if len(bounds) == 1 and bounds[0] == [0, width] else [slice(b, b + 1)
                                                                              for b in range(len(bounds))]
    out = []
    for r, row_bounds in zip(rows, bounds if len(rows) > 1 else bounds[:1]):
        for start, local in chunks:
            for es, ee in zip(row_bounds, row_bounds[1:]):
                qs, qe = max(start, es), min(start + chunk, ee)
                if qs >= qe:
                    continue
                keys = ([(slice(es, qs), False)] if qs > es else []) + [(slice(qs, qe), True)]
                out.append((r, slice(local + qs - start, local + qe - start), keys))
    return out


def _blockwise_kernel(query):
    """The fused attention op that returns its log-sum-exp, for this device and dtype (None: there is none):
    the CPU's flash kernel; on a GPU the flash kernel in 16 bits (AOTriton's on ROCm)."""
    if query.device.type == "cpu":
        return "cpu"
    if query.dtype in (torch.float16, torch.bfloat16):
        return "cuda"
    return None


def _attend(kind: str, q, k, v, causal: bool, scale: float):
    """(output, log-sum-exp, what backward needs besides) of one block."""
    if kind == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse, ()
    if k.shape[1] != q.shape[1]:  # the CUDA flash kernel takes equal head counts
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
    out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale)
    return out, lse, (cq, ck, mq, mk, seed, offset)


def _attend_backward(kind: str, grad, q, k, v, out, lse, extra, causal: bool, scale: float):
    if kind == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, causal, scale=scale)
    groups = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(groups, dim=1) for x in (k, v)) if groups > 1 else (k, v)
    cq, ck, mq, mk, seed, offset = extra
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad, q, kk, vv, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset, scale=scale)
    if groups > 1:  # the replicated heads' gradients back onto their key/value head
        dk, dv = (x.unflatten(1, (k.shape[1], groups)).sum(2) for x in (dk, dv))
    return dq, dk, dv


class _BlockAttention(torch.autograd.Function):
    """Attention of this rank's queries over the whole sequence's keys, block by block with the fused kernel and
    merged by log-sum-exp (ring attention's merge), so no L x S score or mask is ever kept. Backward runs each
    block's kernel backward with the *merged* output and log-sum-exp, which gives exactly that block's share of
    the full attention's gradient (ring-flash-attention's backward)."""

    @staticmethod
    def forward(ctx, q, k, v, blocks, scale):
        kind = _blockwise_kernel(q)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        extras = []
        for rows, qs, keys in blocks:
            parts = [_attend(kind, q[rows, :, qs], k[rows, :, ks], v[rows, :, ks], causal, scale)
                     for ks, causal in keys]
            merged = torch.logsumexp(torch.stack([p[1].float() for p in parts]), dim=0)
            out[rows, :, qs] = sum(torch.exp(p[1].float() - merged)[..., None].to(q.dtype) * p[0] for p in parts)
            lse[rows, :, qs] = merged
            extras.append([p[2] for p in parts])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.blocks, ctx.scale, ctx.kind, ctx.extras = blocks, scale, kind, extras
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for (rows, qs, keys), extras in zip(ctx.blocks, ctx.extras):
            o, m, g = out[rows, :, qs].contiguous(), lse[rows, :, qs].contiguous(), grad[rows, :, qs].contiguous()
            for (ks, causal), extra in zip(keys, extras):
                a, b, c = _attend_backward(ctx.kind, g, q[rows, :, qs].contiguous(), k[rows, :, ks].contiguous(),
                                           v[rows, :, ks].contiguous(), o, m, extra, causal, ctx.scale)
                dq[rows, :, qs] += a
                dk[rows, :, ks] += b
                dv[rows, :, ks] += c
        return dq, dk, dv, None, None


def _ulysses(query, key, value, g: Group, dropout, scaling):
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % g.size:  # fewer key/value heads than ranks (or not a multiple): one per query head
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
        kv_heads = heads
    # one all-to-all for q, k and v together: each rank's head group of all three goes to that rank
    b, _, length, d = query.shape
    groups = [x.reshape(b, g.size, x.shape[1] // g.size, length, d) for x in (query, key, value)]
    got = _seq_to_heads(torch.cat(groups, dim=2), g)  # (B, (H + 2 KV)/N, S, dim) in the row's order
    q, k, v = got.split([heads // g.size, kv_heads // g.size, kv_heads // g.size], dim=1)
    out = _causal_by_example(q, k, v, _state["bounds"], dropout, scaling)
    return _heads_to_seq(out, g)


def _seq_to_heads(x: torch.Tensor, g: Group) -> torch.Tensor:
    """(B, N, H/N, L, D) of this rank's positions -> (B, H/N, S, D) of every position of head group ``rank``, in
    the row's order."""
    b, _, h, length, d = x.shape
    got = _AllToAll.apply(x.transpose(0, 1).contiguous(), g.group)  # [rank i] = rank i's positions of my heads
    whole = got.permute(1, 2, 0, 3, 4).reshape(b, h, g.size * length, d)
    return whole[:, :, _state["order"]]


def _heads_to_seq(x: torch.Tensor, g: Group) -> torch.Tensor:
    b, h, s, d = x.shape
    ranked = x[:, :, _state["gathered"]]  # back to rank-major
    parts = ranked.reshape(b, h, g.size, s // g.size, d).permute(2, 0, 1, 3, 4).contiguous()
    got = _AllToAll.apply(parts, g.group)  # [rank j] = my positions of rank j's heads
    return got.transpose(0, 1).reshape(b, g.size * h, s // g.size, d)


def _causal_by_example(q, k, v, bounds: list[list[int]], dropout, scaling):
    """Causal attention over whole rows, one example at a time when rows are packed (``bounds``: per row, its
    examples' starts and the width; one entry for a batch of unpacked rows)."""
    if len(bounds) == 1 and len(bounds[0]) == 2:  # no row packed: one causal call
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True,
                                              enable_gqa=q.shape[1] != k.shape[1])
    return causal_over_spans(q, k, v, [list(zip(row, row[1:])) for row in bounds], dropout, scaling)


class _AllGather(torch.autograd.Function):
    """Every rank's tensor concatenated along the sequence (dim 2); backward sums each rank's gradient of a
    piece on the rank that owns it (an all-reduce and a slice: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, group, size):
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x, group=group)
        ctx.group, ctx.size, ctx.length = group, size, x.shape[2]
        ctx.rank = dist.get_rank(group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[:, :, ctx.rank * ctx.length:(ctx.rank + 1) * ctx.length], None, None


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all over dim 0; its gradient is the same all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()  # first: empty_like keeps a permuted gradient's strides, which the collective ignores
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def sum_over_group(x: torch.Tensor) -> torch.Tensor:
    """Per-sequence sums of this rank's shard summed over the group (a sequence's log-probability from its
    shards); backward hands each rank the gradient of its own shard's part (the identity: every rank computes the
    same function of the sum, and each one's shard is its own)."""
    return _SumOverGroup.apply(x, _state["group"].group)


class _SumOverGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None

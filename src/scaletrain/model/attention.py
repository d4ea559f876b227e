"""Attention over packed rows, one example at a time: the varlen idea of flash-attention, with SDPA's kernels.

A packed row holds several examples, told apart by ``position_ids`` that restart at 0 (``data/packing.py``).
transformers' SDPA path keeps them apart with a block-diagonal (row x row) mask, so every layer still computes
attention over the whole row: cost ~ row^2 where the examples need only the sum of their own lengths squared.
This implementation (registered with transformers' ``AttentionInterface``) runs causal SDPA on each example's
span instead: the same values (the tests compare loss and gradients with the padded batch), and a third of the
attention work for rows of ~2.5 examples. Batches that are not packed (eval, generation, a row of one example
each) and the features a per-example causal call does not cover (a sliding window, logit soft-capping, a KV
cache) take transformers' own SDPA path with its mask, which handles them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "scaletrain_sdpa_by_example"


def isolate_examples(model) -> str:
    """Make a model that runs SDPA attend per packed example; returns the implementation it now uses (models on
    eager or flash attention keep theirs: the mask / transformers' varlen path keeps examples apart there)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return getattr(config, "_attn_implementation", None) or "eager"
    register()
    model.set_attn_implementation(NAME)
    return NAME


def register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, sdpa_by_example)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the fallback's mask; a packed batch ignores it


def sdpa_by_example(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    position_ids: torch.Tensor | None = None, **kwargs):
    """transformers' attention-function signature: query (batch, heads, seq, dim), key/value (batch, kv heads,
    seq, dim); returns (batch, seq, heads, dim) and no weights."""
    spans = _example_spans(position_ids, query, key) if _plain_causal(module, kwargs) else None
    if spans is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    return causal_over_spans(query, key, value, spans, dropout, scaling).transpose(1, 2).contiguous(), None


def causal_over_spans(query, key, value, spans: list[list[tuple[int, int]]], dropout: float, scaling):
    """Causal SDPA on each example's span of each row (``spans``: per row, [(start, end)]); (batch, heads, seq,
    dim) in and out. Also context parallelism's attention over whole rows (context_parallel.py)."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    # Rows by unbind and examples by split, never by slicing: a slice's backward writes its gradient into a zero
    # tensor of the whole input (one per example, per q/k/v: 30% of a packed tiny model's step went to them),
    # where split's and unbind's backward put all the pieces together in one cat / stack.
    rows = []
    for q, k, v, row in zip(query.unbind(0), key.unbind(0), value.unbind(0), spans):
        lengths = [e - s for s, e in row]
        rows.append(torch.cat([
            F.scaled_dot_product_attention(qs[None], ks[None], vs[None], dropout_p=dropout, scale=scaling,
                                           is_causal=True)
            for qs, ks, vs in zip(q.split(lengths, dim=1), k.split(lengths, dim=1), v.split(lengths, dim=1))],
            dim=2))
    return torch.cat(rows, dim=0)


def _plain_causal(module, kwargs) -> bool:
    return (getattr(module, "is_causal", True) and not getattr(module, "sliding_window", None)
            and kwargs.get("softcap") is None and kwargs.get("s_aux") is None)


_cache: dict = {}  # the spans of the last position_ids seen (every layer of one forward gets the same tensor)


def _example_spans(position_ids, query, key) -> list[list[tuple[int, int]]] | None:
    """[(start, end) per example] per row, or None when the batch is not packed (or holds a cache)."""
    if position_ids is None or query.shape[2] != key.shape[2] or position_ids.shape[-1] != query.shape[2]:
        return None
    if _cache.get("ids") is position_ids:
        return _cache["spans"]
    seq = position_ids.shape[-1]
    ids = position_ids.expand(query.shape[0], seq) if position_ids.shape[0] == 1 else position_ids
    starts = (ids == 0).nonzero().tolist()  # one host sync per forward, not per layer
    spans: list[list[tuple[int, int]]] = [[] for _ in range(ids.shape[0])]
    for b, s in starts:
        spans[b].append(s)
    out = []
    for row in spans:
        if not row or row[0] != 0:
            return None  # positions that do not start a row at 0: not packing's rows
        out.append([(s, e) for s, e in zip(row, row[1:] + [seq])])
    packed = any(len(row) > 1 for row in out)
    _cache.update(ids=position_ids, spans=out if packed else None)
    return _cache["spans"]


# Instinct (CDNA) architectures AOTriton's flash and memory-efficient kernels support; RDNA (gfx11, gfx12) is
# experimental in torch's ROCm builds (behind TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL).
AOTRITON_ARCHS = ("gfx90a", "gfx942", "gfx950")


def kernel_note(device: str, props=None, hip: bool = False, env: dict | None = None,
                flash_enabled: bool = True) -> str:
    """Which fused kernels scaled_dot_product_attention can use on ``device``, said at start: long sequences need
    a fused kernel (the math backend keeps seq x seq scores per head). ``props``: torch's device properties."""
    if device == "cpu":
        return ("attention kernels: SDPA's CPU flash kernel (causal, and the ring's blocks), the math backend "
                "where a mask is given")
    if hip:
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
        if arch in AOTRITON_ARCHS:
            return f"attention kernels: AOTriton flash and memory-efficient ({arch})"
        if arch.startswith(("gfx11", "gfx12")):
            from scaletrain.envvars import TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL

            if (env or {}).get(TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL) == "1":
                return f"attention kernels: AOTriton flash and memory-efficient, experimental on RDNA ({arch})"
            return (f"attention kernels: none fused on RDNA ({arch}) unless {TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL}=1"
                    f": SDPA falls back to the math backend without a word (seq x seq scores per head kept)")
        return f"attention kernels: {arch or 'this GPU'} is not an architecture AOTriton lists; expect the math backend"
    major = getattr(props, "major", 0)
    if major >= 8 and flash_enabled:
        extra = ", cuDNN" if major >= 9 else ""
        return f"attention kernels: flash, memory-efficient{extra} (sm_{major}{getattr(props, 'minor', 0)})"
    why = "turned off (torch.backends.cuda.enable_flash_sdp)" if major >= 8 else "needs sm_80"
    return f"attention kernels: memory-efficient only (flash {why}; sm_{major}{getattr(props, 'minor', 0)})"


def device_kernel_note(device: str) -> str:
    """``kernel_note`` for this process's device."""
    if device == "cpu":
        return kernel_note("cpu")
    import torch

    from scaletrain.envvars import snapshot

    props = torch.cuda.get_device_properties(torch.device(device))
    return kernel_note(device, props, hip=torch.version.hip is not None, env=snapshot(),
                       flash_enabled=torch.backends.cuda.flash_sdp_enabled())

"""The causal-LM loss without the whole [tokens x vocab] logits: the output projection and the cross-entropy run chunk
by chunk, and no chunk's logits are kept for backward.

One 4096-token sequence of a 128k-vocabulary model has 2.1 GB of fp32 logits before softmax and its gradient;
chunks of ``train.loss_chunk_tokens`` hold one chunk's at a time (torchtune's chunked loss, Liger's fused linear
cross-entropy and Apple's cut-cross-entropy exist for this). Written here, not taken from those libraries: it has
to be a drop-in for the output layer *inside* the model's forward, so that DDP's and FSDP2's hooks see an ordinary
forward and backward (FSDP gathers the output layer's weight for it as for any linear), and it computes the token-
loss sum that the token-weighted normalisation (worker/step.py) divides, over target tokens only.

Gradients are computed in forward (no chunk is computed twice); the output layer's ``forward`` is replaced on the
instance (parameter names, checkpoints and ``final/`` are unchanged); with ``head.labels`` set (``chunked_labels``)
it returns the sum of the target tokens' losses (fp32) instead of logits, else it is the plain linear (generation,
classification, the plain path).
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F

from scaletrain.data import IGNORE_INDEX
from scaletrain.errors import ConfigError


def output_layer(model) -> torch.nn.Linear:
    """The causal LM's output projection; an error naming it when it is not a plain linear layer."""
    model = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    cap = getattr(getattr(base, "config", None), "final_logit_softcapping", None)
    if cap:
        raise ConfigError(f"train.loss_chunk_tokens: {type(base).__name__} soft-caps its logits "
                          f"(final_logit_softcapping={cap}) after the output layer, which the chunked loss does "
                          f"not reproduce; set train.loss_chunk_tokens=0 (the plain loss)")
    if type(head) is not torch.nn.Linear:
        raise ConfigError(f"train.loss_chunk_tokens: the output layer of {type(base).__name__} is "
                          f"{type(head).__name__ if head is not None else 'missing'}, not a plain Linear; set "
                          f"train.loss_chunk_tokens=0 (the plain loss)")
    return head


def model_vocab(model, default: int) -> int:
    """The vocabulary the output layer projects to (the model's, which may exceed the tokenizer's)."""
    try:
        return output_layer(model).out_features
    except ConfigError:
        return default


def is_installed(model) -> bool:
    try:
        return getattr(output_layer(model), "chunk_tokens", 0) > 0
    except ConfigError:
        return False


LIGER_FIX = "pip install 'scaletrain[kernels]' (liger-kernel), or set train.loss_backend=chunked"


def liger_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def choose_backend(asked: str, installed: bool, on_gpu: bool) -> str:
    """``train.loss_backend`` resolved on a worker: Liger's fused kernel (Triton: GPUs only) or our chunks."""
    if asked == "chunked" or (asked == "auto" and not (installed and on_gpu)):
        return "chunked"
    if not installed:
        raise ConfigError(f"train.loss_backend=liger: liger-kernel is not installed; {LIGER_FIX}")
    if not on_gpu:
        raise ConfigError("train.loss_backend=liger: Liger's kernels run on GPUs only and this worker has none; "
                          "set train.loss_backend=chunked (or auto)")
    return "liger"


def install(model, chunk_tokens: int, backend: str = "chunked") -> None:
    """Give the model's output layer the chunked loss (see the module's docstring), computed by our chunks or by
    Liger's fused linear cross-entropy (``backend``, from ``choose_backend``)."""
    head = output_layer(model)
    head.chunk_tokens, head.labels, head.shifted, head.loss_backend = chunk_tokens, None, False, backend
    head.chunk_step = None  # train.compile: the compiled chunk_step (compile_loss); None: the eager in-place path
    fused = _liger_loss() if backend == "liger" else None

    def forward(self, hidden):
        if self.labels is None:  # the class's own forward on this head (a deep copy's too: nothing closed over)
            return type(self).forward(self, hidden)
        if fused is not None:
            rows, targets = target_rows(hidden, self.labels, self.shifted)
            return fused(self.weight, rows, targets, self.bias).float()
        return chunked_loss_sum(hidden, self.weight, self.bias, self.labels, self.chunk_tokens, self.shifted,
                                self.chunk_step)

    head.forward = types.MethodType(forward, head)


def _liger_loss():
    """Liger's module, summing over the target tokens as ours does (the step divides by the global count)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")


@contextlib.contextmanager
def chunked_labels(model, labels: torch.Tensor, shifted: bool = False):
    """Within it, the model's forward returns the token-loss sum of ``labels`` (shifted by one here, or already:
    a context-parallel shard's targets) as its logits."""
    head = output_layer(model)
    head.labels, head.shifted = labels, shifted
    try:
        yield
    finally:
        head.labels, head.shifted = None, False


def chunked_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, bias, labels: torch.Tensor,
                     chunk_tokens: int, shifted: bool = False, step=None) -> torch.Tensor:
    """Sum of the next-token cross-entropies of ``labels`` ([B, T]) over the target tokens, from the final hidden
    states ([B, T, H]); the same number as ``token_loss_sum(lm_head(hidden), labels)``. ``step``: a compiled
    ``chunk_step`` for each chunk's loss and logits gradient (train.compile)."""
    rows, targets = target_rows(hidden, labels, shifted)
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
    else:
        dtype = hidden.dtype
    return _ChunkedCE.apply(rows, weight, bias, targets, chunk_tokens, dtype, step)


def chunk_step(chunk: torch.Tensor, w: torch.Tensor, bias, targets: torch.Tensor, dtype: torch.dtype):
    """One chunk's loss sum and d loss / d logits (softmax - one-hot, in ``dtype``), written for torch.compile:
    inductor fuses the projection's epilogue (log-sum-exp, the gather, the softmax, the one-hot) into a few kernels
    and keeps no more than the eager path's in-place version does (``compile_loss``)."""
    logits = _logits(chunk, w, bias, dtype)
    norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    loss = (norm.squeeze(1) - logits.gather(1, targets[:, None]).squeeze(1)).sum()
    g = (logits - norm).exp()
    g = g - F.one_hot(targets, g.shape[-1]).to(g.dtype)
    return loss, g.to(dtype)


def compile_loss(model, compile_fn) -> None:
    """train.compile: each chunk's loss and logits gradient through ``compile_fn(chunk_step)`` (worker/compile.py's
    guarded torch.compile); the loop over chunks stays in Python (their count follows the batch's targets)."""
    output_layer(model).chunk_step = compile_fn(chunk_step)


def target_rows(hidden: torch.Tensor, labels: torch.Tensor, shifted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states of the positions that predict a target, and those targets: no logits for the rest.
    ``shifted``: ``labels`` are next-token targets already (position t predicts labels[t])."""
    if shifted:
        mask = labels != IGNORE_INDEX
        return hidden[mask], labels[mask]
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    return hidden[:, :-1][mask], targets[mask]


class _ChunkedCE(torch.autograd.Function):
    """Forward computes, chunk by chunk, the loss and already its gradients (d loss / d logits = softmax - onehot
    is known once the logits are): one matmul for the logits and two for the gradients per chunk, as the plain
    path's forward and backward, with no chunk recomputed (Liger's fused linear cross-entropy does the same), and
    one chunk-sized tensor alive at a time.
    Backward only scales them by the incoming gradient (1 / the step's tokens). In evaluation (no grad) the
    gradients are skipped."""

    @staticmethod
    def forward(ctx, rows, weight, bias, targets, chunk_tokens, dtype, step=None):
        # (forward runs without grad mode: whether to compute gradients is the inputs' requires_grad)
        want_rows, want_weight = rows.requires_grad, weight.requires_grad
        want_bias = bias is not None and bias.requires_grad
        grads = want_rows or want_weight or want_bias
        total = torch.zeros((), dtype=torch.float32, device=rows.device)
        grad_rows = torch.empty_like(rows) if want_rows else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if want_bias else None
        with torch.autocast(rows.device.type, enabled=False):
            w = weight.to(dtype)
            for start in range(0, rows.shape[0], chunk_tokens):
                chunk = rows[start:start + chunk_tokens]
                t = targets[start:start + chunk_tokens]
                if step is not None and grads:  # train.compile: the fused version of what follows
                    loss, g = step(chunk, w, bias, t, dtype)
                    total += loss
                    _accumulate(g, chunk, w, grad_rows, grad_weight, grad_bias, rows.dtype, dtype, start, chunk_tokens)
                    del g
                    continue
                # One chunk-sized tensor at a time: the logits become exp(logits - max) and then the softmax in
                # place (torch.logsumexp would allocate two more of the chunk's size).
                logits = _logits(chunk, w, bias, dtype)
                picked = logits.gather(1, t[:, None]).squeeze(1)
                peak = logits.amax(dim=-1, keepdim=True)
                g = logits.sub_(peak).exp_()
                norm = g.sum(dim=-1, keepdim=True)
                total += (peak.squeeze(1) + norm.log().squeeze(1) - picked).sum()
                del logits  # g is the same tensor; both names go before the next chunk's logits exist
                if not grads:
                    del g
                    continue
                g.div_(norm)  # the softmax; minus the one-hot target: d loss / d logits
                g[torch.arange(len(t), device=g.device), t] -= 1
                g = g.to(dtype)
                _accumulate(g, chunk, w, grad_rows, grad_weight, grad_bias, rows.dtype, dtype, start, chunk_tokens)
                del g
        ctx.save_for_backward(grad_rows, grad_weight, grad_bias)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_rows, grad_weight, grad_bias = ctx.saved_tensors
        # scaled in place: they were made in forward for this backward alone (a copy would be a second
        # [vocab x hidden] gradient at the peak)
        scale = lambda g, dt: g.mul_(grad_total).to(dt) if g is not None else None
        return (scale(grad_rows, grad_rows.dtype if grad_rows is not None else None),
                scale(grad_weight, ctx.dtypes[0]), scale(grad_bias, ctx.dtypes[1]), None, None, None, None)


def _accumulate(g, chunk, w, grad_rows, grad_weight, grad_bias, rows_dtype, dtype, start: int, size: int) -> None:
    """One chunk's share of the gradients, from its d loss / d logits ``g``: the rows' (g @ W), the weight's and
    the bias's (added in place)."""
    if grad_rows is not None:
        grad_rows[start:start + size] = (g @ w).to(rows_dtype)
    if grad_weight is not None and g.dtype == torch.float32:
        grad_weight.addmm_(g.t(), chunk.float())  # in place: no [vocab x hidden] product to add
    elif grad_weight is not None:
        grad_weight += (g.t() @ chunk.to(dtype)).float()
    if grad_bias is not None:
        grad_bias += g.float().sum(0)


def _logits(rows: torch.Tensor, weight: torch.Tensor, bias, dtype) -> torch.Tensor:
    """One chunk's logits in fp32, computed in ``dtype`` as autocast would (the plain path's ``.float()``)."""
    return F.linear(rows.to(dtype), weight, bias.to(dtype) if bias is not None else None).float()

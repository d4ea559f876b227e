"""Per-device memory of a training job, from the model's config alone (meta device: no weights, no compute).

The activations are not a rule of thumb: the model runs one forward pass on the meta device at the job's
batch and sequence length, and every tensor autograd saves for backward is counted (per transformer block, and
outside the blocks: embeddings, final norm, head, loss). With activation checkpointing a block keeps only its
input, and backward recomputes one block at a time.

Peak = weights + optimizer state + (DDP) gradient buckets + (FSDP) gathered parameters + the larger of
  - the start of backward: every saved activation + the gradient of the fp32 logits,
  - the end of backward: every gradient + the first block's activations,
and, on a CPU (the host is the device), the build: every rank builds the full fp32 model before it is sharded.
Bytes per parameter follow the run's precision policy (scaletrain/model/precision.py): trainable weights are fp32
masters (4), frozen ones in their storage dtype (2 for a bf16 LoRA base on a GPU), AdamW 8 per trainable
parameter, gradients 4.
FSDP shards weights, gradients and optimizer state over its shard group and gathers one block (and the next,
prefetched) in the compute dtype, with the collectives' copy-in and reduce-scatter output buffers;
``fsdp_reshard_after_forward: false`` keeps every block gathered through backward; offload moves the shards to
the host. On a GPU the runtime's own share (context, library workspaces,
communicator buffers) is added as a fixed overhead.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from unittest import mock

import torch
import torch.nn.functional as F

from scaletrain.config.schema import Config
from scaletrain.config.stages import RL_STAGES
from scaletrain.model.dtypes import BYTES
from scaletrain.model.moe import active_parameters, experts_of
from scaletrain.model.precision import policy
from scaletrain.model.quantize import block_linears, bytes_per_param, quantizable
from scaletrain.model.tokenizer import Vocab

GIB = 2**30
GPU_OVERHEAD_BYTES = 1.0 * GIB  # CUDA/HIP context, cuBLAS/hipBLASLt workspaces, NCCL/RCCL buffers
BYTES_FP32 = 4
ADAM_BYTES = 8  # two fp32 moments per trainable parameter


@dataclass(frozen=True)
class Shape:
    """What the memory of a model depends on, at one micro-batch (batch x sequence)."""

    total: int  # parameters
    trainable: int
    layers: int
    hidden: int
    block_params: int  # parameters of one transformer block
    block_trainable: int
    act_blocks: int  # bytes autograd saves in all blocks (no checkpointing)
    act_block_inputs: int  # bytes the blocks keep with checkpointing (their inputs)
    act_outside: int  # bytes saved outside the blocks (embeddings, final norm, head, loss)
    logits: int  # bytes of the fp32 logits (their gradient is the largest buffer at the start of backward)
    eval_logits: int  # the same at the eval batch size
    act_loss: int = 0  # bytes the plain loss keeps for backward (the fp32 logits' log-softmax), not in act_outside
    active_block_params: int = 0  # parameters of one block a token computes with (MoE: top-k of the experts)
    experts: tuple[int, int] | None = None  # MoE: (routed experts, experts per token)
    heads: int = 0  # attention heads (context parallelism: which method applies)
    kv_width: int = 0  # key/value heads x head dim: one token's key (or value) in a layer
    q_width: int = 0  # attention heads x head dim: one token's query (or attention output) in a layer
    seq: int = 0  # positions per rank the pass ran at (the sequence / context_parallel, padded to 2N)
    quantized: int = 0  # QLoRA: frozen parameters stored in 4 or 8 bits (the blocks' linear weights)
    block_quantized: int = 0  # the same in one block

    @property
    def active_total(self) -> int:
        """The parameters a token computes with: all but the routed experts it does not go through."""
        return self.total - self.layers * (self.block_params - self.block_compute_params)

    def moe_line(self) -> str | None:
        """What `plan` says of an MoE model: its experts, and total against active parameters."""
        if not self.experts:
            return None
        count, top_k = self.experts
        return (f"MoE: {count} routed experts, {top_k} per token: {self.total / 1e9:.1f}B parameters held (memory), "
                f"{self.active_total / 1e9:.1f}B active per token (FLOPs, MFU)")

    @property
    def block_compute_params(self) -> int:
        """The parameters of one block that compute per token (FLOPs, MFU); all of them for a dense model."""
        return self.active_block_params or self.block_params


@dataclass(frozen=True)
class Breakdown:
    """Peak bytes per device, by what holds them."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int  # saved for backward at the peak (with the logits' gradient), or the eval logits
    buffers: int  # DDP gradient buckets; FSDP's gathered parameters and the unsharded gradient of a block
    overhead: int
    host: int  # what offload keeps on the host instead
    build: int  # CPU only: the full model each rank builds before sharding (peak if it exceeds training)
    phase: str = ""  # when the training peak happens: backward start / backward end / eval
    reference: int = 0  # preference tuning, full fine-tuning: the frozen reference model (sharded under FSDP);
    # train.stage: distill: the teacher

    @property
    def train_peak(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.activations + self.buffers + self.overhead
                + self.reference)

    @property
    def peak(self) -> int:
        return max(self.train_peak, self.build)

    @property
    def peak_phase(self) -> str:
        return "model build" if self.build > self.train_peak else self.phase

    def as_dict(self) -> dict:
        return {**asdict(self), "peak": self.peak, "peak_phase": self.peak_phase}


def _model_on_meta(cfg: Config, vocab: Vocab):
    from scaletrain.model.build import apply_lora, auto_and_config, enable_checkpointing

    auto, config = auto_and_config(cfg.model, vocab, cfg.data.label_names)
    with torch.device("meta"):
        model = auto.from_config(config)
        if cfg.model.finetuning_type == "lora":
            model = apply_lora(model, cfg.model)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model)
    return model


def model_shape(cfg: Config, vocab: Vocab, batch: int, seq: int, eval_batch: int) -> Shape:
    """One forward pass on the meta device, counting what autograd saves (activation checkpointing off: the
    counts per block give both cases)."""
    import warnings

    plain = cfg.model_copy(update={"train": cfg.train.model_copy(update={"gradient_checkpointing": False})})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' renamed checkpointing switches
        return _model_shape(plain, vocab, batch, seq, eval_batch)


def _model_shape(cfg: Config, vocab: Vocab, batch: int, seq: int, eval_batch: int) -> Shape:
    from scaletrain.model.build import transformer_blocks

    model = _model_on_meta(cfg, vocab)
    model.train()
    params = list(model.parameters())
    blocks = transformer_blocks(model)
    param_ids = {id(p) for p in params}
    seen: dict[int, torch.Tensor] = {}  # kept alive so that ids stay unique during the pass
    where = {"block": None}
    saved = {"blocks": 0, "outside": 0, "loss": 0}

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if id(base) in param_ids or id(t) in param_ids or id(base) in seen:
            return t
        seen[id(base)] = base
        part = {None: "outside", "loss": "loss"}.get(where["block"], "blocks")
        saved[part] += base.numel() * base.element_size()
        return t

    hooks = []
    for i, block in enumerate(blocks):
        hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: where.update(block=i)))
        hooks.append(block.register_forward_hook(lambda m, a, o: where.update(block=None)))
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    with _no_data_dependent_checks(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if cfg.model.task == "causal-lm":
            logits = model(input_ids=ids, use_cache=False).logits
            where["block"] = "loss"  # what the plain loss keeps: none of it with the chunked loss
            shifted = logits[:, :-1].float()
            F.cross_entropy(shifted.reshape(-1, shifted.size(-1)), ids[:, 1:].reshape(-1), reduction="sum")
            where["block"] = None
        else:
            logits = model(input_ids=ids).logits  # no mask: transformers would inspect it with .item()
    for h in hooks:
        h.remove()
    per_token_logits = logits.shape[-1] * BYTES_FP32
    hidden = getattr(getattr(model, "config", None), "hidden_size", 0) or 0
    block = blocks[0] if blocks else None
    experts = experts_of(model.config)
    block_params, active_block = (active_parameters(block.named_parameters(), experts) if block is not None
                                  else (0, 0))
    block_trainable = sum(p.numel() for p in block.parameters() if p.requires_grad) if block is not None else 0
    causal = cfg.model.task == "causal-lm"
    quantized = [m.weight.numel() for _, m in block_linears(model, blocks)  # peft's own lora_A/B train: not those
                 if quantizable(m.weight) and not m.weight.requires_grad] if cfg.model.quantization_bit else []
    mc = model.config
    heads = getattr(mc, "num_attention_heads", 0) or 0
    head_dim = getattr(mc, "head_dim", None) or (hidden // heads if heads else 0)
    kv_width = (getattr(mc, "num_key_value_heads", None) or heads) * head_dim
    return Shape(heads=heads, kv_width=kv_width, q_width=heads * head_dim, seq=seq,
                 total=sum(p.numel() for p in params), trainable=sum(p.numel() for p in params if p.requires_grad),
                 layers=len(blocks), hidden=hidden, block_params=block_params, block_trainable=block_trainable,
                 act_blocks=saved["blocks"], act_block_inputs=len(blocks) * batch * seq * hidden * BYTES_FP32,
                 act_outside=saved["outside"], act_loss=saved["loss"],
                 logits=batch * (seq if causal else 1) * per_token_logits,
                 eval_logits=eval_batch * (seq if causal else 1) * per_token_logits, active_block_params=active_block,
                 experts=(experts.count, experts.top_k) if experts else None,
                 quantized=sum(quantized), block_quantized=sum(quantized) // max(1, len(blocks)))


def _fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """scaled_dot_product_attention as the fused kernels run it (CPU flash; on GPUs flash or memory-efficient):
    backward keeps q, k, v, the output and the log-sum-exp, never the (seq x seq) weights. On the meta device
    torch falls back to the math path, which saves them and would count gigabytes that no real run holds."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


_AUTOCAST = torch.autocast


def _autocast_beside_meta(device_type: str, *args, **kwargs):
    """torch.autocast, and nothing on the meta device (there is no precision to switch there)."""
    if device_type == "meta":
        return contextlib.nullcontext()
    return _AUTOCAST(device_type, *args, **kwargs)


@contextlib.contextmanager
def _no_data_dependent_checks():
    """The meta pass as a real run: fused attention (``_fused_attention``), and no packed-sequence detection
    (transformers inspects position ids with ``.item()``, which a meta tensor cannot answer; the plan's rows are
    plain ones)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(F, "scaled_dot_product_attention", _fused_attention))
        # peft's LoRA on fused experts turns autocast off around its matmul, which torch refuses on "meta"
        stack.enter_context(mock.patch.object(torch, "autocast", _autocast_beside_meta))
        try:
            import transformers.masking_utils as masking
        except ImportError:
            masking = None
        if masking is not None and hasattr(masking, "find_packed_sequence_indices"):
            stack.enter_context(mock.patch.object(masking, "find_packed_sequence_indices", lambda *a, **k: None))
        yield


def loss_terms(cfg: Config, shape: Shape) -> tuple[int, int, int]:
    """(the logits' gradient at the start of backward, what the loss keeps for backward, the evaluation's
    peak): the whole fp32 logits on the plain path; one chunk's logits (the softmax in place) with the chunked loss
    (worker/loss.py), which keeps none of them, and the gradients it computed in forward."""
    from scaletrain.config.batch import chunk_tokens_for, sequences_per_micro_batch

    t, seq = cfg.train, shape.seq or cfg.data.max_length  # one rank's positions (context parallel: its share)
    tokens = sequences_per_micro_batch(t) * seq
    per_token = shape.logits // max(1, tokens)
    # preference tuning reads whole-sequence log-probabilities from the logits: the plain path
    chunked = cfg.model.task == "causal-lm" and t.stage == "sft"
    chunk = chunk_tokens_for(t.loss_chunk_tokens, per_token // BYTES_FP32) if chunked else 0
    if not chunk:  # cross-entropy's backward: the logits' gradient and the softmax it is made from
        return 2 * shape.logits, shape.act_loss, 2 * shape.eval_logits  # eval: the fp32 logits and their softmax
    eval_tokens = sequences_per_micro_batch(t, eval_batch=True) * seq
    # one chunk's logits, turned into the softmax in place (measured: benchmarks/memory.py --part vocab); the
    # gradients computed in forward wait for backward: the hidden states' (tokens x hidden) and, when the output
    # layer trains, its weight's (fp32)
    vocab = per_token // BYTES_FP32
    head_trains = cfg.model.finetuning_type != "lora"
    held = tokens * shape.hidden * BYTES_FP32 + (vocab * shape.hidden * BYTES_FP32 if head_trains else 0)
    return min(tokens, chunk) * per_token + held, 0, min(eval_tokens, chunk) * per_token


def rollout_bytes(cfg: Config, shape: Shape, compute_bytes: int) -> int:
    """train.stage: grpo with the rollout colocated (worker/grpo.py samples a micro-batch at a time): the keys and
    values of every layer over the prompt and the completion for each of its rows, and one position's fp32 logits
    with their softmax."""
    from scaletrain.config.batch import sequence_length

    rows = cfg.train.per_device_train_batch_size
    kv = shape.layers * rows * sequence_length(cfg) * 2 * shape.kv_width * compute_bytes
    vocab = shape.logits // max(1, rows * (shape.seq or sequence_length(cfg))) // BYTES_FP32
    return kv + 2 * rows * vocab * BYTES_FP32


def gathered_kv(cfg: Config, shape: Shape) -> int:
    """Context parallelism's ring: every rank keeps the whole sequence's keys and values of a layer for backward
    (the pass at the rank's positions counted its own); ulysses keeps 1/N of the heads over the whole sequence,
    the same bytes as the pass counted. Per layer kept: all layers, or one with activation checkpointing."""
    n = cfg.scaling.context_parallel
    if n == 1 or not shape.kv_width or cfg.model.task != "causal-lm":
        return 0
    from scaletrain.model.context_parallel import choose_method

    if choose_method(cfg.scaling.context_parallel_method, shape.heads, n) != "ring":
        return 0
    layers = 1 if cfg.train.gradient_checkpointing else shape.layers
    from scaletrain.config.batch import sequences_per_micro_batch

    return layers * sequences_per_micro_batch(cfg.train) * shape.seq * (n - 1) * 2 * shape.kv_width * BYTES_FP32


def estimate(cfg: Config, shape: Shape, world_size: int, device: str = "cpu") -> Breakdown:
    """Peak bytes per device of ``cfg`` on ``world_size`` devices of kind ``device`` ("cpu" or a GPU)."""
    t = cfg.train
    gpu = device != "cpu"
    # the run's own precision policy: trainable fp32 masters, frozen weights in its storage dtype
    prec = policy("gpu" if gpu else "cpu", t.bf16, t.fp16, cfg.model.torch_dtype, t.strategy)
    half = prec.compute != "fp32"
    act_scale = 0.5 if half else 1.0  # autocast keeps most saved activations in 16 bits
    trainable = shape.trainable
    # a QLoRA base: the blocks' linear weights in 4 (or 8) bits, the rest of the frozen weights in their dtype
    qbytes = bytes_per_param(cfg.model.quantization_bit, cfg.model.double_quantization) if shape.quantized else 0
    weights = int(trainable * BYTES[prec.master] + (shape.total - trainable - shape.quantized) * BYTES[prec.frozen]
                  + shape.quantized * qbytes)
    fsdp = t.strategy == "fsdp" and world_size > 1
    group = min(t.fsdp_shard_size or world_size, world_size) if fsdp else 1
    compute_bytes = 2 if half else BYTES_FP32
    if fsdp:
        params, grads, optim = weights // group, trainable * BYTES_FP32 // group, trainable * ADAM_BYTES // group
        outside = max(0, shape.total - shape.layers * shape.block_params)  # embeddings, head: the root's
        gathered_blocks = 2 if t.fsdp_reshard_after_forward else shape.layers  # the current one and the next
        # a gathered block: its quantized weights stay quantized (dequantized one layer at a time in forward)
        block = (shape.block_params - shape.block_quantized) * compute_bytes + shape.block_quantized * qbytes
        buffers = int(min(gathered_blocks, shape.layers) * block + outside * compute_bytes)
        buffers += shape.block_trainable * BYTES_FP32  # the block's unsharded gradient before reduce-scatter
        # and the collectives' own copies: the all-gather's input (this rank's shards of a block, copied in) and
        # the reduce-scatter's output (the block's gradient shard)
        buffers += int(block + shape.block_trainable * BYTES_FP32) // group
    else:
        params, grads, optim = weights, trainable * BYTES_FP32, trainable * ADAM_BYTES
        buffers = trainable * BYTES_FP32 if world_size > 1 and t.strategy == "ddp" else 0  # DDP's buckets
    host = 0
    if fsdp and t.fsdp_offload:
        host, params, grads, optim = params + grads + optim, 0, 0, 0
    per_block = shape.act_blocks // max(1, shape.layers)
    if t.gradient_checkpointing:
        kept = shape.act_block_inputs + shape.act_outside + per_block  # + one block recomputed in backward
    else:
        kept = shape.act_blocks + shape.act_outside
    kept = int((kept + gathered_kv(cfg, shape)) * act_scale)
    logits_grad, loss_kept, evaluation = loss_terms(cfg, shape)
    start_of_backward = kept + loss_kept + logits_grad
    end_of_backward = grads + int(per_block * act_scale)
    phases = {"backward start": start_of_backward, "backward end": end_of_backward, "eval": evaluation}
    if t.stage in RL_STAGES and cfg.rollout.placement == "colocated":
        # sampling with the policy (hf): the micro-batch's KV cache and one position's logits (fp32); vLLM: its own
        # copy of the weights beside the policy, and its KV cache (its reserved share: memory/plan.py's engine line)
        phases["rollout"] = rollout_bytes(cfg, shape, compute_bytes) + (
            shape.total * compute_bytes if cfg.rollout.engine == "vllm" else 0)
    when = max(phases, key=phases.get)
    grads_at_peak = grads if when == "backward end" else 0
    activations = phases[when] - grads_at_peak
    build = 0
    if not gpu:  # the full model on every rank (as loaded: before a QLoRA base is quantized), then its shards
        loaded = trainable * BYTES[prec.master] + (shape.total - trainable) * BYTES[prec.frozen]
        build = max(loaded, weights + (weights // group if fsdp else 0))
    reference = 0
    if (t.stage == "dpo" and cfg.model.finetuning_type != "lora" and t.pref_loss not in ("simpo", "orpo") and (
            not t.precompute_ref_logps)) or (t.stage == "grpo" and cfg.rl.beta > 0 and
                                             cfg.model.finetuning_type != "lora"):
        reference = shape.total * BYTES[prec.master] // group  # a frozen copy of the initial model, sharded like it
    if t.stage == "distill" and cfg.rl.teacher_model:  # the teacher, whole on every rank, its frozen storage
        from scaletrain.model.teacher import teacher_parameters

        reference = teacher_parameters(cfg.rl.teacher_model) * BYTES[prec.frozen]
    return Breakdown(parameters=params, gradients=grads_at_peak, optimizer=optim, activations=activations,
                     buffers=buffers, overhead=int(GPU_OVERHEAD_BYTES) if gpu else 0, host=host, build=build,
                     phase=when, reference=reference)

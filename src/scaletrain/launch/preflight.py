"""One preflight for `train` and `doctor`: config -> tokenizer, prepared data, notes and the memory plan.

Everything that can fail on the model or the data is checked here, in the driver, before a run directory or
a worker exists. `train` and `doctor` both call ``preflight``, so `doctor` accepts exactly what `train` does
(they once disagreed on a packing config). The tokenized data is cached: `train` after `doctor` reuses it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from scaletrain.config.batch import left_out_note, total_steps
from scaletrain.config.schema import Config
from scaletrain.data import PreparedData, prepare_data
from scaletrain.data.stream import prepare_stream
from scaletrain.errors import ConfigError
from scaletrain.memory.estimate import Shape
from scaletrain.memory.plan import fit_notes, shape_for
from scaletrain.model.build import (
    check_lora_target,
    check_model,
    context_parallel_error,
    packing_support_error,
    router_loss_note,
)
from scaletrain.model.files import final_dtype, head_mismatch, model_dir
from scaletrain.model.frozen_base import quantization_note
from scaletrain.model.precision import Policy, policy
from scaletrain.model.processor import image_text_factory
from scaletrain.model.tokenizer import Vocab, load_tokenizer
from scaletrain.worker.compile import MIN_TORCH, torch_too_old
from scaletrain.worker.loss import LIGER_FIX, liger_installed


def torch_version() -> str:
    import torch

    return torch.__version__


@dataclass(frozen=True)
class Preflight:
    cfg: Config  # with what the data decided (model.num_labels, data.label_names)
    tokenizer: object
    vocab: Vocab
    data: PreparedData
    shape: Shape | None  # the model's memory shape (memory/estimate.py), computed once for the job
    shape_error: str = ""  # why there is none (a model the meta-device pass cannot run)

    @property
    def notes(self) -> list[str]:
        return list(self.data.notes)

    def fit_notes(self, use_gpu: bool) -> list[str]:
        """The memory plan against the devices the job was placed on (known after the launcher's plan)."""
        if self.shape is None:
            return [f"memory: no estimate for this model ({self.shape_error}); scaletrain plan cannot size it"]
        return fit_notes(self.cfg, self.shape, use_gpu)

    def precision(self, use_gpu: bool) -> Policy:
        """The precision policy on the devices the job was placed on (a GPU assumed to support bf16 here; the
        worker asks its own device), checking the combination and the checkpoint's stored dtype."""
        t = self.cfg.train
        prec = policy("gpu" if use_gpu else "cpu", t.bf16, t.fp16, self.cfg.model.torch_dtype, t.strategy)
        final_dtype(self.cfg.model, prec.compute)
        return prec

    def quantization_notes(self, use_gpu: bool) -> list[str]:
        """A QLoRA or FP8 base on the devices the job was placed on: its engine and what it quantizes or converts
        (errors: one line)."""
        c = self.cfg
        note = quantization_note(c.model, self.vocab, use_gpu, c.train.strategy, c.scaling.num_workers)
        return [f"model: {note}"] if note else []

    def memory_shape(self) -> dict | None:
        """The shape as the job spec carries it to the workers (they estimate for their own world size)."""
        return asdict(self.shape) if self.shape is not None else None


# Data keys that only mean something to a vision-language model: set to other than their defaults for a text model,
# a mistake said in one line.
IMAGE_KEYS = {"image_max_pixels", "image_min_pixels", "media_dir"}


def preflight(cfg: Config) -> Preflight:
    model_dir(cfg.model.name_or_path)  # a missing model is an error before anything is read
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    vocab = Vocab.of(tokenizer)
    check_model(cfg.model, tokenizer, cfg.data.max_length)
    lora_note = check_lora_target(cfg.model, vocab)
    moe_note = router_loss_note(cfg, vocab)
    if cfg.data.packing and (why := packing_support_error(cfg.model, vocab)):
        raise ConfigError(f"data.packing: {why}")
    s = cfg.scaling
    if s.context_parallel > 1 and (
            why := context_parallel_error(cfg.model, vocab, s.context_parallel, s.context_parallel_method)):
        raise ConfigError(f"scaling.context_parallel={s.context_parallel}: {why}; set scaling.context_parallel: 1")
    rl_note = None
    if cfg.train.stage == "grpo":  # the rewards load and the engine exists, before the data is read
        from scaletrain.rl.rewards import check

        rl_note = check(cfg)
        if cfg.rl.tools or cfg.rl.environment:  # the template writes calls in a form the rollouts read
            from scaletrain.data.templates import resolve_template
            from scaletrain.rl.tools import call_format

            call_format(resolve_template(cfg.data.template, tokenizer)[1])
    if cfg.train.stage == "distill":  # the teacher exists and shares the student's tokenizer
        from scaletrain.model.teacher import check_teacher

        rl_note = check_teacher(cfg.rl.teacher_model, tokenizer)
    if cfg.train.compile and torch_too_old(torch_version()):
        raise ConfigError(f"train.compile: torch {torch_version()} is too old for regional compilation under FSDP2 "
                          f"(torch >= {'.'.join(map(str, MIN_TORCH))}); upgrade torch or remove train.compile")
    if cfg.train.loss_backend == "liger" and not liger_installed():
        raise ConfigError(f"train.loss_backend=liger: liger-kernel is not installed here; {LIGER_FIX}")
    images = image_text_factory(cfg.model.name_or_path, tokenizer)
    changed = sorted(k for k in IMAGE_KEYS if getattr(cfg.data, k) != type(cfg.data).model_fields[k].default)
    if images is None and (keys := changed):  # a resumed run's resolved config names every key: values, not names
        raise ConfigError(f"data.{keys[0]}={getattr(cfg.data, keys[0])}: model.name_or_path={cfg.model.name_or_path} "
                          f"is a text model, which reads no images; remove data.{keys[0]} or use a vision-language "
                          f"model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3)")
    data = prepare_stream(cfg, tokenizer) if cfg.data.streaming else prepare_data(cfg, tokenizer, images)
    cfg = data.resolve(cfg)
    if lora_note:
        data.notes.append(f"model: {lora_note}")
    if s.context_parallel > 1:
        data.notes.append(f"scaling.context_parallel={s.context_parallel}: each row is padded to a multiple of "
                          f"{2 * s.context_parallel} positions for the zig-zag split (padding has no target) and "
                          f"its labels shifted to next-token targets before it")
    if moe_note:
        data.notes.append(moe_note)
    if rl_note:
        data.notes.append(rl_note)
    if (saved := head_mismatch(cfg.model)) is not None:
        data.notes.append(f"model: the classification head of {cfg.model.name_or_path} has {saved} label(s) and "
                          f"this run {cfg.model.num_labels}: it is re-initialised at the new size (the rest of "
                          f"the model is loaded)")
    if data.stream is None:
        total_steps(len(data.train), cfg, cfg.scaling.data_parallel)  # too little data for one global batch
    if data.stream is None and (left := left_out_note(len(data.train), cfg.train, cfg.scaling.data_parallel,
                                                      "packed rows" if cfg.data.packing else "examples")):
        data.notes.append(left)
    try:
        shape, error = shape_for(cfg, vocab), ""
    except Exception as e:  # noqa: BLE001 - a model the meta pass cannot run: the run goes on without a plan
        shape, error = None, type(e).__name__
    return Preflight(cfg, tokenizer, vocab, data, shape, error)

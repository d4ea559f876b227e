"""LoRA on a Mixture-of-Experts model's fused expert weights, merged where the base checkpoint keeps them.

peft adapts a fused 3-D parameter (``experts.gate_up_proj``: experts x out x in, or experts x in x out where the
model class says ``is_transposed``) through ``target_parameters``: one ``ParamWrapper`` per parameter, nested when
a module has two (the outer one's tensors are ``experts.lora_A``, the inner one's ``experts.base_layer.lora_A``),
lora_A of shape (r x experts, in) and lora_B of (out, r x experts). Which file key belongs to which parameter, and
its layout, is what peft decides when it wraps the model, so it is asked: the base model is built on the meta
device from its config.json (no weight read, no memory) and peft injects the saved LoRA config into it.

The checkpoint on disk is often not fused: Qwen3-MoE and Mixtral ship one tensor per expert and projection
(``experts.3.gate_proj.weight``, ``block_sparse_moe.experts.3.w1.weight``), which transformers fuses at load.
Each fused delta is turned into the checkpoint's keys by transformers' own reverse conversion
(``revert_weight_conversion``, the one ``save_pretrained`` uses), so the export has the base's key names and layout
and loads wherever the base loads (vLLM included). The delta formula is peft's ``ParamWrapper.get_delta_weight``
(written out here because that method needs the wrapped parameter's storage, which a meta model has not); the test
holds it equal to peft's ``merge_and_unload``.

Memory: one fused parameter's delta (fp32) at a time, computed when the shard walk first meets one of its keys and
dropped when its last key is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import ConfigError

PEFT_PREFIX = "base_model.model."
# The saved adapter_config.json fields that are peft's run-time bookkeeping, not LoraConfig's arguments.
_NOT_CONFIG = ("peft_type", "task_type", "auto_mapping", "base_model_name_or_path", "revision")


@dataclass(frozen=True)
class _Wrapped:
    """One fused parameter peft adapted: its model key, its adapter tensors' key prefix, its layout."""

    param: str  # e.g. model.layers.0.mlp.experts.gate_up_proj
    prefix: str  # e.g. model.layers.0.mlp.experts.base_layer (then .lora_A.weight / .lora_B.weight)
    experts: int
    swapped: bool  # peft's _did_swap_in_out_features: the parameter is (experts, out, in)
    shape: tuple[int, ...]


def _meta_model(base: Path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _wrapped(model, settings: dict) -> list[_Wrapped]:
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora.layer import ParamWrapper

    config = LoraConfig(**{k: v for k, v in settings.items()
                           if k in LoraConfig.__dataclass_fields__ and k not in _NOT_CONFIG})
    inject_adapter_in_model(config, model, low_cpu_mem_usage=True)
    out = []
    for name, module in model.named_modules():
        if isinstance(module, ParamWrapper):
            owner = ".".join(p for p in name.split(".") if p != "base_layer")
            out.append(_Wrapped(f"{owner}.{module.parameter_name}", name, module.num_experts,
                                module._did_swap_in_out_features, tuple(module.get_param().shape)))
    return out


class FusedDeltas:
    """The checkpoint-format deltas of an adapter's fused-parameter LoRA, handed out key by key."""

    def __init__(self, base: Path, settings: dict, tensors: dict, scale: float, where: Path):
        """``tensors``: the adapter's tensors keyed without peft's prefix; the ones this takes are removed."""
        import torch
        from transformers.core_model_loading import revert_weight_conversion

        self._revert = revert_weight_conversion
        self.scale = scale
        self.model = _meta_model(base)
        self._factors: dict[str, tuple] = {}  # model param key -> (A, B, wrapped)
        for w in _wrapped(self.model, settings):
            a, b = tensors.pop(f"{w.prefix}.lora_A.weight", None), tensors.pop(f"{w.prefix}.lora_B.weight", None)
            if a is None or b is None:
                raise ConfigError(f"{where}: the adapter targets {w.param} (target_parameters) and holds no "
                                  f"lora_A/lora_B for it ({w.prefix}); it was saved from another model")
            self._factors[w.param] = (a, b, w)
        # Which checkpoint keys each fused parameter becomes: the reverse conversion run on meta tensors.
        self._owner: dict[str, str] = {}  # checkpoint key -> model param key
        for param, (_, _, w) in self._factors.items():
            for key in self._revert(self.model, {param: torch.empty(w.shape, device="meta")}):
                self._owner[key] = param
        self._ready: dict[str, object] = {}  # checkpoint key -> delta, for the parameter being written

    def keys(self) -> set[str]:
        return set(self._owner)

    def checkpoint_key(self, model_key: str) -> str:
        """The checkpoint's name for a plain (not fused) weight (Mixtral's ``mlp.gate`` is ``block_sparse_moe.gate``
        on disk)."""
        import torch

        return next(iter(self._revert(self.model, {model_key: torch.empty(0, device="meta")})))

    def delta(self, key: str):
        if key not in self._ready:
            param = self._owner[key]
            self._ready.update(self._revert(self.model, {param: self._fused_delta(param)}))
        return self._ready.pop(key).contiguous()

    def _fused_delta(self, param: str):
        import torch

        a, b, w = self._factors[param]
        a, b = a.float(), b.float()
        if w.experts == 1:  # a 2-D parameter: plain LoRA
            return b @ a * self.scale
        a = a.reshape(w.experts, -1, a.shape[-1])  # experts x r x in
        b = b.reshape(b.shape[0], -1, w.experts)  # out x r x experts
        return torch.einsum("ore,eri->eoi" if w.swapped else "ore,eri->eio", b, a) * self.scale


"""What LoRA adapts, made explicit before peft sees it, for dense and Mixture-of-Experts models alike.

``model.lora_target`` takes module or parameter names and four words: ``all-linear`` (every linear layer but the
output head and, on an MoE model, the router; and the routed experts), ``attention``, ``experts`` (the routed
experts: fused 3-D parameters through peft's ``target_parameters``, or one linear module per expert) and
``router``. The router is adapted only when asked: its LoRA changes which experts every token reaches. What is
adapted is resolved on the model (a meta-device copy in the driver), said at start and kept in summary.json; a
target that names experts on a dense model, or experts of a kind LoRA cannot reach, is a one-line error.

Written here rather than passing ``all-linear`` to peft: peft's shorthand also adapts the router and sets a
rank pattern for the fused experts it then reports as unmatched (peft 0.21), with no word about either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scaletrain.errors import ConfigError
from scaletrain.model.moe import experts_of, is_routed_expert

WORDS = ("all-linear", "attention", "experts", "router")
ATTENTION_PARTS = ("self_attn", "attention", "attn")
ROUTER_NAMES = ("gate", "router")  # the MoE block's router module (Qwen, Mixtral, DeepSeek: gate; gpt-oss: router)
HEAD_NAMES = ("lm_head", "score", "classifier")


@dataclass(frozen=True)
class LoraTargets:
    modules: list[str]  # peft target_modules: module name suffixes
    parameters: list[str] = field(default_factory=list)  # peft target_parameters: fused expert weights
    router: bool = False
    expert_tensors: int = 0  # routed-expert weights adapted (fused parameters or per-expert modules)
    shared_experts: bool = False  # the model has shared experts (adapted with the other linear layers)
    moe: bool = False

    @property
    def peft_modules(self):
        """peft's target_modules (its ``all-linear`` shorthand for a dense model), or None (parameters only)."""
        if self.modules == ["all-linear"]:
            return "all-linear"
        return self.modules or None

    def note(self, r: int) -> str:
        what = ("every linear layer" if self.modules == ["all-linear"] else
                f"{len(self.modules)} linear layers of the unfrozen parts" if any("." in m for m in self.modules)
                else ", ".join(self.modules))
        parts = [f"LoRA (rank {r}) on {what or 'no linear module'}"]
        if not self.moe:
            return parts[0]
        if self.parameters:
            parts.append(f"the routed experts' {', '.join(sorted(set(self.parameters)))} ({self.expert_tensors} fused "
                         f"tensors, rank {r} per expert)")
        elif self.expert_tensors:
            parts.append(f"{self.expert_tensors} per-expert linear layers")
        parts.append("the router adapted" if self.router else "the router frozen (model.lora_target: router adapts it)")
        if self.shared_experts:
            parts.append("shared experts adapted with the linear layers")
        return "; ".join(parts)

    def summary(self) -> dict:
        return {"lora/modules": sorted(set(self.modules)), "lora/expert_parameters": sorted(set(self.parameters)),
                "lora/expert_tensors_adapted": self.expert_tensors, "lora/router_adapted": self.router}


def _linear_names(model) -> dict[str, str]:
    """Full name -> the last part of every nn.Linear of the model."""
    import torch

    return {n: n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def resolve(model, target, name: str = "the model") -> LoraTargets:
    """The modules and parameters ``target`` (``model.lora_target``) adapts on ``model`` (an unwrapped HF model,
    meta device or real)."""
    experts = experts_of(getattr(model, "config", {}) or {})
    if experts is None and target == "all-linear":
        return LoraTargets(["all-linear"])  # peft's shorthand: every linear layer but the output head
    linear = _linear_names(model)
    words = ["all-linear"] if target == "all-linear" else [t for t in target if t in WORDS]
    names = [] if target == "all-linear" else [t for t in target if t not in WORDS]
    if experts is None and ({"experts", "router"} & set(words) or any("expert" in t for t in names)):
        asked = ", ".join(w for w in words if w in ("experts", "router")) or next(t for t in names if "expert" in t)
        raise ConfigError(f"model.lora_target: {asked} names the experts or router of a Mixture-of-Experts model, and "
                          f"{name} is dense; use attention, all-linear or its module names")
    routers = _routers(model) if experts else set()
    per_expert = {n for n in linear if experts and is_routed_expert(n + ".weight", (0,), experts)}
    fused = ([(n, p) for n, p in model.named_parameters() if is_routed_expert(n, tuple(p.shape), experts)
              and n.rsplit(".", 1)[-1] not in ("weight", "bias") and not any(n.startswith(m + ".") for m in
                                                                              per_expert)]
             if experts else [])
    fused = [(n, p) for n, p in fused if not n.endswith("_bias")]  # gpt-oss: LoRA on weights, not biases
    modules: set[str] = set()
    parameters: set[str] = set()
    router = False
    for word in words:
        if word in ("all-linear", "attention"):
            modules |= {short for full, short in linear.items()
                        if short not in HEAD_NAMES and full not in routers and full not in per_expert
                        and (word == "all-linear" or any(p in full.split(".") for p in ATTENTION_PARTS))}
        if word in ("all-linear", "experts") and experts is not None:
            modules |= {linear[n] for n in per_expert}
            parameters |= {_expert_key(n) for n, _ in fused}
            if not per_expert and not fused:
                kinds = sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith(".experts")})
                raise ConfigError(f"model.lora_target: the experts of {name} ({', '.join(kinds) or 'none found'}) are "
                                  f"neither fused parameters nor linear layers; LoRA cannot adapt them: name its "
                                  f"attention (model.lora_target: attention)")
        if word == "router":
            if not routers:
                raise ConfigError(f"model.lora_target: router: {name} has no router LoRA can adapt")
            router = True
            modules |= {linear[n] for n in routers if n in linear}
            parameters |= {_expert_key(n + ".weight") for n in routers if n not in linear}
    for t in names:  # module or parameter names, as given (checked against the model by check_lora_target)
        if any(p == t or p.endswith("." + t) for p, _ in fused):
            parameters.add(t)
        else:
            modules.add(t)
    if "experts" in words and not parameters and not (modules & {linear[n] for n in per_expert}):
        raise ConfigError(f"model.lora_target: experts: no routed-expert weight of {name} matched; name them "
                          f"(e.g. gate_up_proj, down_proj)")
    adapted = sum(1 for n, _ in fused if _expert_key(n) in parameters) + sum(
        1 for n in per_expert if linear[n] in modules)
    shared = any("shared_expert" in n for n in linear)
    return LoraTargets(sorted(modules), sorted(parameters), router, adapted, shared, experts is not None)


def _expert_key(name: str) -> str:
    """peft's target_parameters key of a parameter: its module's last part and the parameter's name."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else name


def _routers(model) -> set[str]:
    """The routers: a ``gate``/``router`` module beside an ``experts`` module (nn.Linear, or transformers 5's router
    modules that hold a ``weight``)."""
    names = dict(model.named_modules())
    blocks = {n.rsplit(".", 1)[0] for n in names if n.endswith(".experts")}
    return {f"{b}.{r}" for b in blocks for r in ROUTER_NAMES if f"{b}.{r}" in names}

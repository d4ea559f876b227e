"""Mixture-of-Experts facts of a model, from its config and parameter names alone: how many routed experts, how
many each token goes through, and so what share of the expert weights computes per token.

A token passes through top-k of E routed experts (plus any shared experts, which every token uses): the FLOPs of a
step and the MFU come from the active parameters, while memory holds all of them. Read by the memory plan, the
planner's step time and the worker's FLOP count; nothing here builds or imports a model.
"""

from __future__ import annotations

from dataclasses import dataclass

# Config names of the routed expert count and the experts per token, across transformers' MoE families: Qwen2/3-MoE
# (num_experts, num_experts_per_tok), Mixtral and gpt-oss (num_local_experts, num_experts_per_tok), DeepSeek-V2/V3
# (n_routed_experts, num_experts_per_tok), OLMoE/Granite (num_experts), gpt-oss also experts_per_token.
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk")


@dataclass(frozen=True)
class Experts:
    count: int  # routed experts per MoE layer
    top_k: int  # routed experts each token goes through
    # DeepSeek-V2's group-limited routing (topk_method group_limited_greedy): the experts in n_group groups, a
    # token's top-k taken from its topk_group best groups (by their best expert's probability); None: plain top-k.
    groups: tuple[int, int] | None = None

    @property
    def active_share(self) -> float:
        return self.top_k / self.count


def experts_of(config) -> Experts | None:
    """The routed experts of a model config (an HF config object or its dict), or None for a dense model."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    text = get("text_config")
    if text is not None and not any(get(k) for k in EXPERT_COUNT_KEYS):
        return experts_of(text)
    count = next((get(k) for k in EXPERT_COUNT_KEYS if isinstance(get(k), int) and get(k) > 1), None)
    top_k = next((get(k) for k in TOP_K_KEYS if isinstance(get(k), int) and get(k) > 0), None)
    groups = (get("n_group"), get("topk_group")) \
        if get("topk_method") == "group_limited_greedy" and get("n_group") and get("topk_group") else None
    return Experts(count, top_k, groups) if count and top_k else None


@dataclass(frozen=True)
class RouterTerms:
    """The coefficients of the router's auxiliary losses for a run, each with where it came from."""

    aux: float  # the load-balancing loss
    aux_from: str
    z: float  # the router z-loss (ST-MoE: the mean squared log-sum-exp of the router logits)
    z_from: str


def router_terms(config, aux_asked: float | None, z_asked: float | None) -> RouterTerms:
    """The asked coefficients, else the checkpoint's: ``router_aux_loss_coef`` (Qwen-MoE, Mixtral, gpt-oss, OLMoE),
    DeepSeek-V2's ``aux_loss_alpha`` (its released config's name, which transformers' DeepSeek-V2 code reads but never
    adds to the loss: scaletrain adds it), ``router_z_loss_coef`` (Switch Transformers' name); else 0."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    if aux_asked is not None:
        aux, aux_from = aux_asked, "train.moe_aux_loss_coef"
    elif get("router_aux_loss_coef"):
        aux, aux_from = float(get("router_aux_loss_coef")), "the checkpoint's router_aux_loss_coef"
    elif get("aux_loss_alpha"):
        aux, aux_from = float(get("aux_loss_alpha")), ("the checkpoint's aux_loss_alpha: transformers' code for "
                                                       f"{get('model_type', 'this model')} omits the term, added here")
    else:
        aux, aux_from = 0.0, "the checkpoint names none"
    if z_asked is not None:
        z, z_from = z_asked, "train.moe_z_loss_coef"
    elif get("router_z_loss_coef"):
        z, z_from = float(get("router_z_loss_coef")), "the checkpoint's router_z_loss_coef"
    else:
        z, z_from = 0.0, "the checkpoint names none"
    return RouterTerms(aux, aux_from, z, z_from)


def is_routed_expert(name: str, shape: tuple[int, ...], experts: Experts) -> bool:
    """A parameter of the routed experts: fused (a leading dimension of E under ``.experts.``) or one expert's own
    module (``.experts.<i>.``); shared experts (``shared_expert``) and the router are not."""
    if ".experts." not in f".{name}" or "shared_expert" in name:
        return False
    rest = name.split(".experts.", 1)[1]
    return rest.split(".", 1)[0].isdigit() or (len(shape) >= 2 and shape[0] == experts.count)


def active_parameters(named_parameters, experts: Experts | None) -> tuple[int, int]:
    """(parameters, parameters active per token) of ``named_parameters``: a routed expert's weights count top-k/E."""
    total = active = 0.0
    for name, p in named_parameters:
        n = p.numel()
        total += n
        active += n * experts.active_share if experts and is_routed_expert(name, tuple(p.shape), experts) else n
    return int(total), int(round(active))

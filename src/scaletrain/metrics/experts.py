"""An MoE router's health from its assignment counts (layer x expert, over the ranks and steps of a record): each
expert's share of the layer's top-k assignments relative to its fair share (1.0 = 1/E of them; 0 = starved), the
smallest and largest per layer, and the routing entropy per layer normalised to 0..1 (1: uniform)."""

from __future__ import annotations

import math


def router_health(counts: list[list[float]]) -> dict:
    shares, low, high, entropy = [], [], [], []
    for layer in counts:
        total, experts = sum(layer), len(layer)
        if total <= 0 or experts < 2:
            continue
        p = [c / total for c in layer]
        shares.append([round(x * experts, 4) for x in p])
        low.append(min(shares[-1]))
        high.append(max(shares[-1]))
        entropy.append(-sum(x * math.log(x) for x in p if x > 0) / math.log(experts))
    if not shares:
        return {}
    return {"moe/expert_shares": shares, "moe/expert_share_min": low, "moe/expert_share_max": high,
            "moe/router_entropy": entropy}

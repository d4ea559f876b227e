"""What a GRPO run overlaps with what (#74), said the same way at a run's start and by `plan`: where the rollouts
are sampled, whether the next steps' rollouts run while a step trains (rollout.max_staleness), the bound on the lag,
and the sampler's correction. Pure: it reads the config only."""

from __future__ import annotations

from scaletrain.config.stages import RL_STAGES


def overlap_line(cfg) -> str | None:
    """One line for a ``train.stage: grpo`` config, None otherwise."""
    if cfg.train.stage not in RL_STAGES:
        return None
    r, rl = cfg.rollout, cfg.rl
    engine = f"{r.engine} engine"
    if r.placement == "colocated":
        where = f"rollouts: {engine} on the training devices; sampling and training take turns (nothing overlaps)"
    else:
        where = f"rollouts: {engine} on {r.num_workers} actor(s) of their own"
        if r.max_staleness:
            where += (f"; the next {r.max_staleness} step(s)' prompts are sampled while a step trains, by weights up "
                      f"to {r.max_staleness} optimizer step(s) older (rollout.max_staleness={r.max_staleness}; the "
                      f"first step of a run or an epoch samples at once)")
        else:
            where += "; the actors sample, then the trainer trains (rollout.max_staleness=0: nothing overlaps)"
    corrected = rl.vllm_importance_sampling_correction and (r.engine == "vllm" or r.max_staleness > 0)
    if corrected:
        low, high = rl.vllm_importance_sampling_clip_min, rl.vllm_importance_sampling_clip_max
        bounds = f"[{0 if low is None else low:g}, {'inf' if high is None else format(high, 'g')}]"
        where += f"; the sampler's correction: {rl.vllm_importance_sampling_mode} within {bounds}"
    if rl.off_policy_mask_threshold is not None:
        where += f"; off-policy sequences masked above a KL of {rl.off_policy_mask_threshold:g}"
    return where + "; time/rollout_s is what each step waits for its rollouts"

"""GRPO's losses and advantages equal TRL 1.13's on the same log-probabilities, completions and advantages
(trl/trainer/grpo_trainer.py, called with its own code on one process and one micro-batch, where its normalisation
is the global one), for every loss variant, and the advantages for every reward scaling; and the normalisation over
the global batch makes 2 ranks with completions of uneven length equal 1 rank on the concatenated batch."""

import types

import pytest
import torch

from scaletrain.config.rl import LOSS_TYPES, RLConfig
from scaletrain.rl import loss as rl_loss
from scaletrain.rl.advantages import advantages

# importing TRL runs a subprocess (its availability checks): the in-process tier
pytestmark = pytest.mark.loop

B, T, L_MAX = 6, 7, 9


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logps = (torch.randn(B, T, generator=g) * 0.3 - 1.5).requires_grad_(True)
    old = (logps.detach() + torch.randn(B, T, generator=g) * 0.2)
    ref = logps.detach() + torch.randn(B, T, generator=g) * 0.1
    mask = torch.ones(B, T)
    for i, n in enumerate([7, 3, 5, 1, 6, 4]):  # completions of uneven length
        mask[i, n:] = 0
    adv = torch.randn(B, generator=g)
    return logps, old, ref, mask, adv


def _trl_loss(rl: RLConfig, logps, old, ref, mask, adv, sampling=None, is_ratio=None):
    from trl.trainer.grpo_trainer import GRPOTrainer

    fake = types.SimpleNamespace(
        loss_type=rl.loss_type, beta=rl.beta, epsilon_low=rl.epsilon,
        epsilon_high=rl.epsilon_high if rl.epsilon_high is not None else rl.epsilon,
        importance_sampling_level=rl.importance_sampling_level, top_entropy_quantile=1.0,
        off_policy_mask_threshold=rl.off_policy_mask_threshold, get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        use_vllm=is_ratio is not None, vllm_importance_sampling_correction=is_ratio is not None,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=L_MAX, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1,
                                   sapo_temperature_pos=rl.sapo_temperature_pos,
                                   sapo_temperature_neg=rl.sapo_temperature_neg),
        accelerator=types.SimpleNamespace(num_processes=1, gather=lambda x: x.reshape(-1), reduce=lambda x, **k: x,
                                          gather_for_metrics=lambda x: x),
        _metrics={"train": __import__("collections").defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None))
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    if sampling is not None:
        inputs["sampling_per_token_logps"] = sampling
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return GRPOTrainer._compute_loss(fake, None, inputs)


def _trl_is_ratio(rl: RLConfig, old, sampling, mask):
    """TRL 1.13's importance-sampling ratio of a vLLM sampler, as _generate_and_score_completions computes it
    (the lines reproduced: they are inline in that method)."""
    import math

    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    sequence_level_is = rl.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if sequence_level_is else diff)
    lo, hi = rl.vllm_importance_sampling_clip_min, rl.vllm_importance_sampling_clip_max
    if rl.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=lo, max=hi)
    invalid = (ratio < (lo if lo is not None else -math.inf)) | (ratio > (hi if hi is not None else math.inf))
    return ratio.masked_fill(invalid, value=0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo"])
def test_the_samplers_correction_and_the_off_policy_mask_equal_trls(mode, loss_type):
    """#74: a sampler that is not the trainer (a stale policy, vLLM's kernels): its log-probabilities against the
    trainer's give TRL 1.13's importance weights for each of its four modes (bounds on both sides, a NaN the
    sampler could not score), and the loss with them and DeepSeek-V3.2's off-policy mask equals TRL's, gradient
    too, to 1e-6."""
    rl = RLConfig(loss_type=loss_type, beta=0.04, epsilon_high=0.28, max_completion_length=L_MAX,
                  vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=0.8,
                  vllm_importance_sampling_clip_max=1.2, off_policy_mask_threshold=0.05)
    logps, old, ref, mask, adv = _inputs(5)
    g = torch.Generator().manual_seed(9)
    sampling = old + 0.1 + torch.randn(B, T, generator=g) * 0.25  # a stale policy: some ratios clipped, some KL
    sampling[2, 1] = torch.nan
    theirs_ratio = _trl_is_ratio(rl, logps.detach(), sampling, mask)
    ours_ratio = rl_loss.sampling_correction(logps.detach(), sampling, mask, rl)
    assert torch.equal(ours_ratio, theirs_ratio)
    assert 0 < int(((theirs_ratio == 0) | (theirs_ratio == 1.2) | (theirs_ratio == 0.8)).sum())  # the bounds bite
    theirs = _trl_loss(rl, logps, None, ref, mask, adv, sampling, theirs_ratio)
    (their_grad,) = torch.autograd.grad(theirs, logps)
    keep = rl_loss.off_policy_mask(adv, logps, sampling, mask, rl.off_policy_mask_threshold)
    assert 0 < int(keep.sum()) < B  # the mask drops some completion
    terms = rl_loss.per_token_loss(logps, None, ref, adv, mask, rl, is_weights=ours_ratio, keep=keep)
    ours = rl_loss.reduce(terms.per_token, mask, rl, rl_loss.Totals(B, float(mask.sum())))
    (our_grad,) = torch.autograd.grad(ours, logps)
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)
    assert torch.allclose(our_grad, their_grad, atol=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_the_loss_and_its_gradients_equal_trls(loss_type, beta, level):
    if level == "sequence" and loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        pytest.skip("TRL refuses sequence-level importance sampling with token-summing losses")
    rl = RLConfig(loss_type=loss_type, beta=beta, importance_sampling_level=level, epsilon_high=0.28,
                  max_completion_length=L_MAX)
    logps, old, ref, mask, adv = _inputs()
    theirs = _trl_loss(rl, logps, old, ref, mask, adv)
    (their_grad,) = torch.autograd.grad(theirs, logps)
    terms = rl_loss.per_token_loss(logps, old, ref if beta else None, adv, mask, rl)
    ours = rl_loss.reduce(terms.per_token, mask, rl, rl_loss.Totals(B, float(mask.sum())))
    (our_grad,) = torch.autograd.grad(ours, logps)
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)
    assert torch.allclose(our_grad, their_grad, atol=1e-6)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_two_ranks_with_uneven_completions_equal_one_rank_on_the_whole_batch(loss_type):
    """Each rank's share x world size, averaged over ranks as DDP does, is the 1-rank loss and gradient."""
    rl = RLConfig(loss_type=loss_type, beta=0.04, max_completion_length=L_MAX)
    logps, old, ref, mask, adv = _inputs(3)
    totals = rl_loss.Totals(B, float(mask.sum()))
    one = rl_loss.reduce(rl_loss.per_token_loss(logps, old, ref, adv, mask, rl).per_token, mask, rl, totals)
    (g1,) = torch.autograd.grad(one, logps)
    halves = []
    for part in (slice(0, 2), slice(2, B)):  # 2 and 4 completions: uneven shares
        t = rl_loss.per_token_loss(logps[part], old[part], ref[part], adv[part], mask[part], rl)
        halves.append(rl_loss.reduce(t.per_token, mask[part], rl, totals) * 2)
    two = (halves[0] + halves[1]) / 2
    (g2,) = torch.autograd.grad(two, logps)
    assert float(two) == pytest.approx(float(one), abs=1e-6) and torch.allclose(g1, g2, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_the_advantages_equal_trls_for_each_reward_scaling(scale):
    """TRL's sum_then_normalize, reproduced from its trainer's formula with its own nanstd, unscorable rows (every
    function None) included."""
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(1)
    per_func = torch.randn(12, 2, generator=g, dtype=torch.float64)
    per_func[3, :] = torch.nan  # unscorable
    per_func[5, 1] = torch.nan  # one function not applicable
    w = torch.tensor([1.0, 0.5], dtype=torch.float64)
    ours, rewards = advantages(per_func, w, 4, scale)
    unscorable = torch.isnan(per_func).all(dim=1)
    r = (per_func * w.unsqueeze(0)).nansum(dim=1)
    r[unscorable] = torch.nan
    mean = torch.nanmean(r.view(-1, 4), dim=1).repeat_interleave(4)
    std = nanstd(r).expand_as(r) if scale == "batch" else nanstd(r.view(-1, 4), dim=1).repeat_interleave(4)
    theirs = r - mean
    if scale != "none":
        theirs = theirs / (std + 1e-4)
    theirs = torch.nan_to_num(theirs, nan=0.0)
    assert torch.allclose(ours, theirs, atol=1e-12) and float(ours[3]) == 0.0


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_distillation_divergence_equals_trls_gkd(beta):
    """#74: the generalized JSD of train.stage: distill, over the completion tokens' positions, equals TRL's GKD
    generalized_jsd_loss (its own code; masked positions out, the mean over the rest), value and gradient."""
    import torch.nn.functional as F
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    g = torch.Generator().manual_seed(4)
    student = torch.randn(3, 5, 11, generator=g).requires_grad_(True)
    teacher = torch.randn(3, 5, 11, generator=g)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, 3:] = -100
    labels[2, :2] = -100
    theirs = GKDTrainer.generalized_jsd_loss(student, teacher, labels, beta=beta, temperature=0.9)
    (their_grad,) = torch.autograd.grad(theirs, student)
    mask = (labels != -100).float()
    per = rl_loss.generalized_jsd(F.log_softmax(student / 0.9, -1), F.log_softmax(teacher / 0.9, -1), beta)
    ours = (per * mask).sum() / mask.sum()
    (our_grad,) = torch.autograd.grad(ours, student)
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)
    assert torch.allclose(our_grad, their_grad, atol=1e-6)

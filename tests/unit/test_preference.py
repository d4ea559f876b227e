"""Preference losses against TRL's own code on the same logits (values and gradients), and preference data:
LLaMA-Factory's ranking formats, the shared prompt, the shared cut, skips, and bad input before any worker."""

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from scaletrain.config import validate
from scaletrain.config.schema import TrainConfig
from scaletrain.data import IGNORE_INDEX, prepare_data
from scaletrain.errors import ConfigError, DataError
from scaletrain.model.tokenizer import load_tokenizer
from scaletrain.worker.preference import Sides, pair_losses

trl = pytest.importorskip("trl")

B, T, V = 3, 9, 11


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2 * B, T, V, generator=g, dtype=torch.float64)
    input_ids = torch.randint(0, V, (2 * B, T), generator=g)
    completion = torch.zeros(2 * B, T, dtype=torch.long)
    for i, (start, end) in enumerate([(3, 9), (4, 7), (2, 8), (5, 9), (3, 6), (4, 9)]):
        completion[i, start:end] = 1  # prompts of several lengths, replies of several lengths, some padding
    labels = torch.where(completion.bool(), input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    ref = torch.randn(2 * B, generator=g, dtype=torch.float64) * 3 - 20
    return logits, input_ids, completion, labels, ref


def _trl_dpo(logits, input_ids, completion, ref, loss_type, beta):
    """TRL's DPOTrainer._compute_loss on these logits (a model that returns them; precomputed reference)."""
    from trl import DPOTrainer

    accelerator = SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x)
    fake = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
        beta=beta, label_smoothing=0.0, use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": completion,
              "ref_chosen_logps": ref[:B], "ref_rejected_logps": ref[B:]}
    return DPOTrainer._compute_loss(fake, lambda **kw: SimpleNamespace(logits=logits), inputs, False)


def _ours(logits, labels, ref, **train):
    policy = Sides.of(logits, labels)
    reference = Sides(ref[:B], ref[B:], policy.chosen_tokens, policy.rejected_tokens)
    losses, _, _ = pair_losses(TrainConfig(stage="dpo", **train), policy, reference)
    return losses.mean()


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_dpo_losses_and_gradients_equal_trls(loss_type):
    logits, input_ids, completion, labels, ref = _batch()
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    theirs = _trl_dpo(a, input_ids, completion, ref, loss_type, beta=0.3)
    ours = _ours(b, labels, ref, pref_loss=loss_type, pref_beta=0.3)
    theirs.backward()
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6) and theirs.item() > 0
    assert torch.allclose(a.grad, b.grad, atol=1e-6) and a.grad.abs().sum() > 0
    # the test can fail: another beta is another loss
    assert _ours(logits, labels, ref, pref_loss=loss_type, pref_beta=0.7).item() != pytest.approx(theirs.item())


def _trl_reference_free(kind: str, avg_c, avg_r, beta: float, gamma: float):
    """TRL's CPO (loss_type simpo) and ORPO loss functions on the same mean log-probabilities."""
    accelerator = SimpleNamespace(device="cpu")
    if kind == "simpo":
        from trl.experimental.cpo.cpo_trainer import CPOTrainer

        fake = SimpleNamespace(alpha=0.0, accelerator=accelerator, loss_type="simpo", simpo_gamma=gamma, beta=beta,
                               label_smoothing=0.0)
        losses, _, _ = CPOTrainer.cpo_loss(fake, avg_c, avg_r)
        return losses.mean()
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    losses, *_ = ORPOTrainer.odds_ratio_loss(SimpleNamespace(beta=beta, accelerator=accelerator), avg_c, avg_r)
    return (-avg_c - losses).mean()  # ORPO: the chosen NLL (per token, LLaMA-Factory's) minus beta x log sigma


@pytest.mark.parametrize("kind", ["simpo", "orpo"])
def test_simpo_and_orpo_equal_trls(kind):
    logits, _, _, labels, ref = _batch(1)
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    sides = Sides.of(a, labels)
    theirs = _trl_reference_free(kind, *sides.mean(), beta=2.0, gamma=0.5)
    ours = _ours(b, labels, ref, pref_loss=kind, pref_beta=2.0, simpo_gamma=0.5)
    theirs.backward()
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert torch.allclose(a.grad, b.grad, atol=1e-6) and a.grad.abs().sum() > 0


def test_label_smoothing_and_the_sft_term():
    logits, _, _, labels, ref = _batch(2)
    policy, ref = Sides.of(logits, labels), ref.float()
    reference = Sides(ref[:B], ref[B:], policy.chosen_tokens, policy.rejected_tokens)
    delta = (policy.chosen - reference.chosen) - (policy.rejected - reference.rejected)
    smoothed, _, _ = pair_losses(TrainConfig(stage="dpo", dpo_label_smoothing=0.2), policy, reference)
    expected = -0.8 * torch.nn.functional.logsigmoid(0.1 * delta) - 0.2 * torch.nn.functional.logsigmoid(-0.1 * delta)
    assert torch.allclose(smoothed, expected)
    plain, _, _ = pair_losses(TrainConfig(stage="dpo"), policy, reference)
    ftx, _, _ = pair_losses(TrainConfig(stage="dpo", pref_ftx=0.5), policy, reference)
    assert torch.allclose(ftx - plain, 0.5 * -policy.mean()[0])


# --- data ---------------------------------------------------------------------------------------------------

PAIRS = [{"instruction": "Tell me about tea.", "chosen": "I like tea very much.", "rejected": "I hate tea."},
         {"instruction": "Tell me about rain.", "chosen": "Rain is lovely.", "rejected": "Rain is lovely."},
         {"instruction": "Tell me about jazz.", "chosen": "", "rejected": "No."}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:tiny-llama")


def _cfg(tmp_path, data: dict, stage: str = "dpo"):
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                     "data": {"eval_ratio": 0.0, "max_length": 128, "template": "chatml", "max_bad_ratio": 0.9,
                              **data},
                     "train": {"stage": stage}, "output": {"output_dir": str(tmp_path / "runs")}})


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_alpaca_pairs_share_the_prompt_and_label_only_the_replies(tmp_path, tok):
    prepared = prepare_data(_cfg(tmp_path, {"train_file": str(_write(tmp_path / "p.jsonl", PAIRS))}), tok)
    assert len(prepared.train) == 1  # the equal pair and the empty one are skipped and counted
    assert any("chosen and rejected are the same reply" in k for k in prepared.skipped)
    assert any("empty or missing 'chosen'" in k for k in prepared.skipped)
    ex = prepared.train[0]
    c, r = ex["chosen_input_ids"], ex["rejected_input_ids"]
    n_prompt = next(i for i, y in enumerate(ex["chosen_labels"]) if y != IGNORE_INDEX)
    assert c[:n_prompt] == r[:n_prompt] and tok.decode(c[:n_prompt]).endswith("<|im_start|>assistant\n")
    for ids, labels, reply in ((c, ex["chosen_labels"], "I like tea very much."), (r, ex["rejected_labels"],
                                                                                     "I hate tea.")):
        assert tok.decode([t for t, y in zip(ids, labels) if y != IGNORE_INDEX]) == reply + "<|im_end|>"
    assert ex["length"] == len(c) + len(r)


def test_sharegpt_ranking_entries_and_a_shared_cut(tmp_path, tok):
    long_reply = " ".join(["word"] * 200)
    rows = [{"conversations": [{"from": "human", "value": "Question " * 30}],
             "chosen": {"from": "gpt", "value": long_reply}, "rejected": {"from": "gpt", "value": "Short."}}]
    d = tmp_path / "lf"
    d.mkdir()
    _write(d / "dpo.jsonl", rows)
    (d / "dataset_info.json").write_text(json.dumps({"dpo_demo": {
        "file_name": "dpo.jsonl", "formatting": "sharegpt", "ranking": True,
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}}))
    cfg = _cfg(tmp_path, {"dataset_dir": str(d), "dataset": "dpo_demo", "max_truncated_ratio": 1.0})
    ex = prepare_data(cfg, tok).train[0]
    c, r = ex["chosen_input_ids"], ex["rejected_input_ids"]
    assert len(c) == 128 and r[:10] == c[:10]  # both sides share the prompt's cut; the long reply keeps its budget
    with pytest.raises(DataError, match="a preference \\(ranking\\) dataset; train on it with train.stage=dpo"):
        prepare_data(_cfg(tmp_path, {"dataset_dir": str(d), "dataset": "dpo_demo"}, stage="sft"), tok)


def test_bad_preference_input_is_one_line_before_any_worker(tmp_path, tok):
    pairs = _write(tmp_path / "p.jsonl", PAIRS[:1])
    with pytest.raises(DataError, match="the records are preference pairs .* set train.stage=dpo"):
        prepare_data(_cfg(tmp_path, {"train_file": str(pairs)}, stage="sft"), tok)
    sft = _write(tmp_path / "s.jsonl", [{"instruction": "q", "output": "a"}])
    with pytest.raises(DataError, match="column 'chosen' is missing .* set data.chosen_column"):
        prepare_data(_cfg(tmp_path, {"train_file": str(sft)}), tok)
    with pytest.raises(ConfigError, match="pref_beta"):
        validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                  "data": {"train_file": str(pairs)}, "train": {"stage": "dpo", "pref_beta": 0}})
    with pytest.raises(ConfigError, match="train.precompute_ref_logps is not yet supported with train.stage=kto"):
        validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                  "data": {"train_file": str(pairs)}, "train": {"stage": "kto", "precompute_ref_logps": True}})


def test_stage_dpo_refuses_what_it_cannot_train(tmp_path):
    base = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"}, "data": {"train_file": "p.jsonl"},
            "train": {"stage": "dpo"}}
    with pytest.raises(ConfigError, match="data.packing with train.stage=dpo is not yet supported"):
        validate({**base, "data": {"train_file": "p.jsonl", "packing": True}})
    with pytest.raises(ConfigError, match="train.pref_loss=simpo has no reference model; remove it"):
        validate({**base, "train": {"stage": "dpo", "pref_loss": "simpo", "precompute_ref_logps": True}})
    with pytest.raises(ConfigError, match="train.stage=rm has no reference model"):
        validate({**base, "train": {"stage": "rm", "precompute_ref_logps": True}})
    with pytest.raises(ConfigError, match="train.stage=dpo trains a causal LM; set model.task=causal-lm"):
        validate({**base, "model": {"name_or_path": "builtin:tiny-bert", "task": "sequence-classification"}})


def test_the_reward_model_loss_is_the_pairwise_logistic_loss():
    from scaletrain.worker.preference import reward_losses

    scores = torch.tensor([[2.0], [0.5], [1.0], [1.5]])  # chosen 2.0, 0.5; rejected 1.0, 1.5
    model = lambda **kw: SimpleNamespace(logits=scores)  # a model that returns these scores
    losses, chosen, rejected = reward_losses(model, {"input_ids": torch.zeros(4, 3, dtype=torch.long)})
    expected = -torch.nn.functional.logsigmoid(torch.tensor([1.0, -1.0]))
    assert torch.allclose(losses, expected) and chosen.tolist() == [2.0, 0.5] and rejected.tolist() == [1.0, 1.5]


def test_kto_loss_equals_trls():
    """TRL's KTOTrainer._compute_loss on the same logits, with the reference and KL log-probabilities given."""
    from trl import KTOTrainer

    from scaletrain.worker.preference import kto_losses, sequence_logps

    logits, input_ids, completion, labels, _ = _batch(3)
    g = torch.Generator().manual_seed(7)
    ref, ref_kl, policy_kl = (torch.randn(2 * B, generator=g) * 3 - 20 for _ in range(3))
    tags = torch.tensor([True, False, True, True, False, False])
    accelerator = SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x)
    fake = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False,
        precompute_ref_logps=True, calculate_KL=True, loss_type="kto", beta=0.3, desirable_weight=1.5,
        undesirable_weight=0.7, _metrics=defaultdict(lambda: defaultdict(list)), _total_train_tokens=0, _tp_size=1,
        _compute_kl_logps=lambda model, batch: policy_kl)
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": completion,
              "label": tags, "ref_logps": ref, "ref_KL_logps": ref_kl}
    theirs = KTOTrainer._compute_loss(fake, lambda **kw: SimpleNamespace(logits=a), inputs, False)
    policy, _ = sequence_logps(b, labels)
    kl = (policy_kl - ref_kl).mean().clamp(min=0)
    train = TrainConfig(stage="kto", pref_beta=0.3, kto_chosen_weight=1.5, kto_rejected_weight=0.7)
    ours = kto_losses(train, policy, ref, kl, tags)[0].mean()
    theirs.backward()
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6) and theirs.item() > 0
    assert torch.allclose(a.grad.float(), b.grad.float(), atol=1e-6) and a.grad.abs().sum() > 0


def test_a_kto_dataset_without_tags_is_one_line_and_bad_tags_are_skipped(tmp_path, tok):
    rows = [{"instruction": "q", "output": "a", "kto_tag": True}, {"instruction": "q", "output": "b", "kto_tag": "?"}]
    data = {"train_file": str(_write(tmp_path / "k.jsonl", rows))}
    prepared = prepare_data(_cfg(tmp_path, data, stage="kto"), tok)
    assert len(prepared.train) == 1 and any("'kto_tag' is '?', not true or false" in k for k in prepared.skipped)
    untagged = {"train_file": str(_write(tmp_path / "u.jsonl", [{"instruction": "q", "output": "a"}]))}
    with pytest.raises(DataError, match="column 'kto_tag' is missing .* set data.kto_tag_column"):
        prepare_data(_cfg(tmp_path, untagged, stage="kto"), tok)

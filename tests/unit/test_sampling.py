"""GRPO's sampling loop (rl/sampling.py): each row draws from its own random stream, so a row's completion is the
same alone or in a batch with other prompts of other lengths (1 and N workers hold different micro-batches); greedy
at a tiny temperature equals transformers' generate; top-p keeps the smallest set reaching p."""

import pytest
import torch

from scaletrain.rl.sampling import sample, top_p_filter


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()


def _left_padded(prompts, pad=0):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    return ids, mask


def test_a_row_samples_the_same_alone_or_in_any_batch():
    model = _model()
    a, b = [5, 6, 7], [9, 10, 11, 12, 13, 14]
    gen = lambda seed: torch.Generator().manual_seed(seed)
    alone, logps = sample(model, *_left_padded([a]), [gen(1)], 6, eos=49, pad=0)
    batched, _ = sample(model, *_left_padded([b, a, b]), [gen(2), gen(1), gen(3)], 6, eos=49, pad=0)
    assert batched[1, :alone.shape[1]].tolist() == alone[0].tolist()
    again, _ = sample(model, *_left_padded([a, b]), [gen(1), gen(2)], 6, eos=49, pad=0)
    assert again[0, :alone.shape[1]].tolist() == alone[0].tolist()
    # the drawn tokens' log-probabilities equal a full forward's over prompt + completion (the trainer's), fp32
    full = torch.tensor([a + alone[0].tolist()])
    expected = model(input_ids=full).logits[0, len(a) - 1:-1].float().log_softmax(-1)
    expected = expected.gather(-1, alone[0].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logps[0], expected, atol=1e-5)


def test_a_cold_temperature_is_greedy_as_generate():
    model = _model()
    ids, mask = _left_padded([[5, 6, 7], [8, 9]])
    ours, _ = sample(model, ids, mask, [torch.Generator().manual_seed(0)] * 2, 5, eos=49, pad=0, temperature=1e-4)
    theirs = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0,
                            eos_token_id=49)[:, ids.shape[1]:]
    assert ours.tolist() == theirs.tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.75))
    assert kept.tolist() == [[True, True, False, False]]


def test_no_rank_stops_sampling_before_the_others():
    """Under FSDP every forward is a collective: a rank whose rows are all done keeps stepping (padding) until
    every rank's are (``all_done``, asked once a token), so the ranks run the same forwards."""
    model = _model()
    ids, mask = _left_padded([[5, 6, 7]])
    eos = int(model(input_ids=ids).logits[0, -1].argmax())  # the first token (greedy) is the EOS: done at once
    asked = []

    def all_done(mine: bool) -> bool:  # another rank still samples for 3 tokens
        asked.append(mine)
        return len(asked) >= 3

    out, _ = sample(model, ids, mask, [torch.Generator().manual_seed(0)], 6, eos=eos, pad=0, temperature=1e-6,
                    all_done=all_done)
    assert asked == [True, True, True] and out.tolist() == [[eos, 0, 0]]
    alone, _ = sample(model, ids, mask, [torch.Generator().manual_seed(0)], 6, eos=eos, pad=0, temperature=1e-6)
    assert alone.tolist() == [[eos]]


def test_the_trainers_log_probabilities_are_of_the_logits_over_the_temperature():
    """TRL divides the logits by the sampling temperature before the log-softmax, for the policy, the old policy and
    the reference alike (grpo_trainer.py, _get_per_token_logps_and_entropies): so does completion_logps."""
    from scaletrain.worker.completions import completion_logps

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=g)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    starts = torch.tensor([2, 3])
    ours = completion_logps(logits, ids, starts, 3, temperature=0.7)
    for i in range(2):
        for j in range(3):
            at = int(starts[i]) + j
            assert ours[i, j] == pytest.approx(float((logits[i, at - 1] / 0.7).log_softmax(-1)[ids[i, at]]), abs=1e-6)

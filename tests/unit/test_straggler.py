"""#75: the slowest-rank wait sized from the data's lengths (scaling/straggler.py), against brute force."""

import itertools
import random
import statistics

import pytest

from scaletrain.scaling.straggler import Work, expected_max, waits

WORK = Work(linear_flops_per_token=6e9, attention_flops_per_token=1.5e6, flops_per_s=5e14)
LENGTHS = [12, 40, 7, 95, 33, 60, 21, 150, 18, 75, 44, 9]  # a small lengths file


def test_the_closed_form_is_the_mean_of_the_max_over_every_draw():
    costs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for n in (1, 2, 3):
        every = [max(draw) for draw in itertools.product(costs, repeat=n)]  # each of n ranks draws any of them
        assert expected_max(costs, n) == pytest.approx(statistics.fmean(every), rel=1e-12)


def test_the_random_sampler_wait_equals_ranks_drawing_their_own_micro_batches():
    """Brute force: N ranks each draw a micro-batch of 2 rows of a fresh shuffle, padded to its longest; the mean
    of the slowest less the mean of all, per micro-batch, over 200k draws, against the model's (2 x accumulation)."""
    import numpy as np

    gen = np.random.default_rng(1)
    model = waits(LENGTHS, WORK, [1, 2, 4, 8], batch=2, accumulation=2)
    assert model[1].wait_s == 0.0
    lengths = np.array(LENGTHS)
    cost = np.zeros(max(LENGTHS) + 1)  # a micro-batch's cost by its longest row (the rows padded to it)
    for n in set(LENGTHS):
        cost[n] = WORK.padded_s([n, n])
    for n in (2, 4, 8):
        draws = (200_000 // n, n)
        first = gen.integers(0, len(LENGTHS), draws)
        second = gen.integers(0, len(LENGTHS) - 1, draws)
        second += second >= first  # two distinct rows of a shuffle
        costs = cost[np.maximum(lengths[first], lengths[second])]
        brute = 2 * (costs.max(axis=1).mean() - costs.mean())
        assert model[n].wait_s == pytest.approx(brute, rel=0.03), n
    assert model[2].wait_s < model[4].wait_s < model[8].wait_s  # the wait grows with the ranks
    assert model[8].spread > 0.3 and model[8].mean_s == pytest.approx(model[2].mean_s)


def test_a_micro_batch_costs_its_padded_flops_at_the_rate():
    assert WORK.padded_s([10, 30]) == pytest.approx(2 * 30 * (6e9 + 1.5e6 * 30) / 5e14)
    assert WORK.packed_s([10, 30]) == pytest.approx((40 * 6e9 + (100 + 900) * 1.5e6) / 5e14)


def test_balancing_and_packing_remove_most_of_the_wait():
    """The levers plan names: the length-balanced sampler (the sampler's own assignment) and packing."""
    rng = random.Random(0)
    lengths = [int(rng.lognormvariate(4.5, 0.8)) + 8 for _ in range(512)]
    random_ = waits(lengths, WORK, [8], batch=4, accumulation=4, sampler="random", sync="step")[8]
    balanced = waits(lengths, WORK, [8], batch=4, accumulation=4, sampler="balanced", sync="step")[8]
    packed = waits(lengths, WORK, [8], batch=1, accumulation=4, sampler="packed", sync="step", width=1024)[8]
    assert balanced.wait_s < 0.3 * random_.wait_s and packed.wait_s < 0.5 * random_.wait_s
    assert balanced.wait_s >= 0


@pytest.mark.parametrize("kwargs,message", [({"sampler": "sorted"}, "choose random, balanced or packed"),
                                            ({"sampler": "packed"}, "give the packs' width"),
                                            ({"batch": 0}, "must be >= 1")])
def test_bad_inputs_are_named(kwargs, message):
    args = {"batch": 2, "accumulation": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        waits(LENGTHS, WORK, [2], **args)

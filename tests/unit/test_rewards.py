"""GRPO's built-in rewards and the checks on a user's reward function (rl/rewards.py)."""

import math

import pytest

from scaletrain.errors import ConfigError, TrainingError
from scaletrain.rl import rewards


@pytest.mark.parametrize("completion,answer,expected", [
    ("The sum is 12.", "12", 1.0), ("<answer>12</answer>", "12", 1.0), ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("I think 11", "12", 0.0), ("no number at all", "12", 0.0), ("12", None, None),
    ([{"role": "assistant", "content": "It is 7"}], "7", 1.0),
])
def test_accuracy_checks_the_final_answer_against_the_data(completion, answer, expected):
    assert rewards.accuracy([completion], answer=[answer]) == [expected]


def test_accuracy_without_math_verify_compares_the_extracted_answer(monkeypatch):
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "math_verify" else real(name, *a, **k))
    assert rewards.accuracy(["it is 1,024", "<answer> x+1 </answer>", "9"], answer=["1024", "x+1", "8"]) == \
        [1.0, 1.0, 0.0]


def test_format_and_length():
    assert rewards.format_reward(["<think>a</think><answer>b</answer>", "b"]) == [1.0, 0.0]
    assert rewards.length_penalty(["", "", ""], completion_ids=[[0] * 6, [0] * 7, [0] * 8],
                                  max_completion_length=8) == [0.0, -0.5, -1.0]


def test_a_user_function_is_loaded_and_checked(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("X = 1\ndef good(prompts, completions, **kw):\n    return [1.0, None]\n"
                 "def nan(prompts, completions, **kw):\n    return [float('nan'), 0.0]\n")
    good = rewards.load(f"{f}:good")
    assert rewards.call("good", good, ["p", "p"], ["a", "b"], [[1], [2]], {})[0] == 1.0
    assert math.isnan(rewards.call("good", good, ["p", "p"], ["a", "b"], [[1], [2]], {})[1])
    with pytest.raises(TrainingError, match="nan returned nan for example 0"):
        rewards.call("nan", rewards.load(f"{f}:nan"), ["p", "p"], ["a", "b"], [[1], [2]], {})
    with pytest.raises(ConfigError, match="'X' in .* is a int, not a function"):
        rewards.load(f"{f}:X")


def test_rewards_that_score_nothing_are_said_once_and_end_the_run_after_n_steps():
    """#72: the first step with a whole unscored group is said with each function's count; N steps in a row with
    nothing scored stop the run; a scored step resets the count."""
    import torch

    from scaletrain.rl.unscored import Unscored

    nan = math.nan
    judge = Unscored(["accuracy", "vowels"], num_generations=2, stop_after=2)
    # group 0 scored by vowels; group 1 unscored by both
    v = judge.observe(torch.tensor([[nan, 0.5], [nan, 0.1], [nan, nan], [nan, nan]]), step=1)
    assert v.stop is None and "step 1: the reward functions scored 1 of 2 prompt groups" in v.notice
    assert "accuracy 4/4, vowels 2/4" in v.notice
    everything = torch.full((4, 2), nan)
    v = judge.observe(everything, step=2)
    assert v.notice is None and v.stop is None  # said once; one step of nothing so far
    v = judge.observe(everything, step=3)
    assert v.stop.startswith("step 3: the reward functions scored no completion for 2 steps in a row")
    assert "monitor.alerts.unscored_steps: 0" in v.stop
    judge.observe(torch.zeros(4, 2), step=4)
    assert judge.observe(everything, step=5).stop is None  # the count starts again after a scored step
    resumed = Unscored(["accuracy", "vowels"], 2, 2)
    resumed.load_state_dict(judge.state_dict())
    assert resumed.observe(everything, step=6).stop is not None  # a resumed run keeps the count
    assert Unscored(["a"], 2, 0).observe(torch.full((4, 1), nan), step=1).stop is None  # 0: train on

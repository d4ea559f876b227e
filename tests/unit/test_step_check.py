"""The per-step NaN/stop agreement: read one step late unless the step writes something."""

import math

from scaletrain.config.schema import Config
from scaletrain.rundir import RunDir
from scaletrain.worker.step_check import StepCheck, writes_at


class _Spec:
    total_steps = 20


class _Meter:
    def __init__(self, every=0):
        self.every = every

    def record_due(self, step):
        return step % 5 == 0

    def probe_due(self, step):
        return bool(self.every) and step % self.every == 0


def test_a_nan_is_reported_with_its_own_step_one_step_later(tmp_path):
    check = StepCheck(str(tmp_path), "cpu")
    assert check.advance(1, 0.7, wait=False) == (None, False)
    assert check.advance(2, math.nan, wait=False) == (None, False)  # still in flight
    bad, stop = check.advance(3, 0.6, wait=False)
    assert bad[0] == 2 and math.isnan(bad[1]) and not stop


def test_a_step_that_writes_reads_its_own_answer_first(tmp_path):
    check = StepCheck(str(tmp_path), "cpu")
    check.advance(1, 0.7, wait=False)
    bad, _ = check.advance(2, math.inf, wait=True)
    assert bad == (2, math.inf)
    assert check._pending is None  # nothing left in flight after a writing step


def test_the_earlier_bad_step_wins_when_both_are_read(tmp_path):
    check = StepCheck(str(tmp_path), "cpu")
    check.advance(4, math.nan, wait=False)
    bad, _ = check.advance(5, math.nan, wait=True)
    assert bad[0] == 4


def test_the_stop_file_stops_at_the_next_step_or_at_once_on_a_writing_step(tmp_path):
    check = StepCheck(str(tmp_path), "cpu")
    check.advance(1, 0.5, wait=False)
    RunDir(tmp_path).stop.touch()
    assert check.advance(2, 0.5, wait=False) == (None, False)  # step 1's answer: no stop file then
    assert check.advance(3, 0.5, wait=False) == (None, True)
    other = StepCheck(str(tmp_path), "cpu")
    assert other.advance(1, 0.5, wait=True) == (None, True)


def test_writing_steps():
    cfg = Config.model_validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x.jsonl"},
                                 "train": {"logging_steps": 5, "eval_steps": 7}, "checkpoint": {"save_steps": 6}})
    writes = [s for s in range(1, 21) if writes_at(s, cfg, _Spec(), _Meter())]
    assert writes == [5, 6, 7, 10, 12, 14, 15, 18, 20]
    assert writes_at(3, cfg, _Spec(), _Meter(every=3))  # a breakdown probe writes a record

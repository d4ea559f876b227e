"""The record of the examples each step trained: a later attempt supersedes the steps a killed one trained after
its last checkpoint; ranks' ids are joined per step."""

import json

from scaletrain.worker.seen import ExampleRecord, start_attempt, trained


def _write(folder, first, rank, steps):
    if rank == 0:
        start_attempt(folder, first)
    rec = ExampleRecord(folder, first, rank)
    for step, ids in steps:
        rec.write(step, 0, ids)
    rec.close()


def test_a_later_attempt_supersedes_what_a_killed_one_trained_after_its_checkpoint(tmp_path):
    folder = tmp_path / "examples"
    _write(folder, 1, 0, [(1, [0, 1]), (2, [4, 5]), (3, [8, 9]), (4, [12, 13])])  # killed at 4, saved at 2
    _write(folder, 1, 1, [(1, [2, 3]), (2, [6, 7]), (3, [10, 11])])  # rank 1 died before writing step 4
    _write(folder, 3, 0, [(3, [8, 9, 10, 11]), (4, [12, 13, 14, 15])])  # resumed from step 2 on one worker
    seen = trained(folder)
    assert seen == {1: {"epoch": 0, "ids": [0, 1, 2, 3]}, 2: {"epoch": 0, "ids": [4, 5, 6, 7]},
                    3: {"epoch": 0, "ids": [8, 9, 10, 11]}, 4: {"epoch": 0, "ids": [12, 13, 14, 15]}}
    assert (folder / "from-step-3-rank-0.jsonl").read_text().splitlines()[0] == json.dumps(
        {"step": 3, "epoch": 0, "ids": [8, 9, 10, 11]})


def test_an_attempt_from_the_same_step_replaces_every_rank_file_of_the_earlier_one(tmp_path):
    _write(tmp_path, 1, 0, [(1, [0, 1]), (2, [4, 5])])  # 2 workers, killed before any checkpoint
    _write(tmp_path, 1, 1, [(1, [2, 3]), (2, [6, 7])])
    _write(tmp_path, 1, 0, [(1, [0, 1, 2, 3])])  # started again on 1 worker: rank 1's lines were not kept
    assert trained(tmp_path) == {1: {"epoch": 0, "ids": [0, 1, 2, 3]}}


"""#74: what a GRPO run overlaps with what, said at its start and by `plan` (rl/overlap.py)."""

from scaletrain.config import validate
from scaletrain.rl.overlap import overlap_line


def _cfg(**rollout):
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                     "data": {"train_file": "x.jsonl", "formatting": "messages"},
                     "train": {"stage": "grpo", "per_device_train_batch_size": 8},
                     "rl": {"num_generations": 4}, "rollout": rollout, "scaling": {"launcher": "ray"}})


def test_the_line_says_what_overlaps_the_bound_and_the_correction():
    assert "take turns (nothing overlaps)" in overlap_line(_cfg())
    sync = overlap_line(_cfg(placement="separate", num_workers=2))
    assert "on 2 actor(s) of their own" in sync and "rollout.max_staleness=0: nothing overlaps" in sync
    assert "correction" not in sync  # the hf engine at staleness 0 samples with the trainer's weights
    async_ = overlap_line(_cfg(placement="separate", max_staleness=1))
    assert "the next 1 step(s)' prompts are sampled while a step trains, by weights up to 1 optimizer step(s) older" \
        in async_
    assert "the sampler's correction: sequence_mask within [0, 3]" in async_
    assert overlap_line(validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                                  "data": {"train_file": "x.jsonl"}})) is None

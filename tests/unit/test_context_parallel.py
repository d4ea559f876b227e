"""Context parallelism without processes: the zig-zag split, the label shift before it, the padding to 2N, the
method's choice and the config's refusals (the collectives: on gloo in tests/loop/test_context_parallel.py)."""

import pytest
import torch

from scaletrain.errors import ConfigError
from scaletrain.model import context_parallel as cp

IGNORE = -100


def test_zigzag_gives_each_rank_an_early_and_a_late_chunk_and_covers_the_row_once():
    assert cp.shard_index(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp.shard_index(8, 2, 1).tolist() == [2, 3, 4, 5]
    whole = torch.cat([cp.shard_index(16, 4, r) for r in range(4)])
    assert sorted(whole.tolist()) == list(range(16))
    # causal work (the number of earlier positions attended) is the same on every rank
    work = [int((cp.shard_index(16, 4, r) + 1).sum()) for r in range(4)]
    assert len(set(work)) == 1


def test_labels_are_shifted_before_the_split_and_the_row_padded_to_2n():
    ids = torch.arange(10, 15)[None]  # 5 tokens: padded to 8 for 2 ranks
    labels = torch.tensor([[IGNORE, 11, 12, 13, 14]])
    shards = [cp.shard_batch({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}, 2, r,
                             pad_id=0) for r in range(2)]
    assert shards[0]["input_ids"].tolist() == [[10, 11, 0, 0]] and shards[1]["input_ids"].tolist() == [[12, 13, 14, 0]]
    # position t's target is token t + 1, whichever rank holds t + 1: rank 0's position 1 predicts rank 1's 12
    assert shards[0]["shift_labels"].tolist() == [[11, 12, IGNORE, IGNORE]]
    assert shards[1]["shift_labels"].tolist() == [[13, 14, IGNORE, IGNORE]]
    assert shards[0]["position_ids"].tolist() == [[0, 1, 6, 7]] and shards[1]["position_ids"].tolist() == [[2, 3, 4, 5]]
    assert "labels" not in shards[0]
    # the shard's padding mask (the attention builds its own; an MoE router counts real tokens with it)
    assert [s["attention_mask"].tolist() for s in shards] == [[[1, 1, 0, 0]], [[1, 1, 1, 0]]]
    targets = sum(int((s["shift_labels"] != IGNORE).sum()) for s in shards)
    assert targets == int((labels[:, 1:] != IGNORE).sum())  # every target once over the group


def test_packed_rows_keep_their_position_ids_and_the_whole_row_for_the_attention():
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0]])
    batch = {"input_ids": torch.arange(8)[None], "labels": torch.arange(8)[None], "position_ids": positions}
    shard = cp.shard_batch(batch, 2, 1)
    assert shard["position_ids"].tolist() == [[2, 0, 1, 2]]
    assert torch.equal(shard["cp_positions"], positions)


def test_the_method_follows_the_heads():
    assert cp.choose_method("auto", 32, 4) == "ulysses"
    assert cp.choose_method("auto", 6, 4) == "ring"
    assert cp.choose_method("ring", 32, 4) == "ring"
    with pytest.raises(ConfigError, match="context_parallel_method=ulysses: the model's 6 attention heads .*ring"):
        cp.choose_method("ulysses", 6, 4)


def _cfg(**scaling):
    return {"model": {"name_or_path": "m", "task": "causal-lm"}, "data": {"train_file": "d.jsonl"},
            "scaling": {"num_workers": 4, **scaling}}


def test_config_refuses_what_context_parallelism_cannot_do():
    from pydantic import ValidationError

    from scaletrain.config.schema import Config

    ok = Config.model_validate(_cfg(context_parallel=2))
    assert ok.scaling.data_parallel == 2
    with pytest.raises(ValidationError, match="context_parallel=3 does not divide scaling.num_workers=4"):
        Config.model_validate(_cfg(context_parallel=3))
    with pytest.raises(ValidationError, match=r"num_workers=\[3, 4\] with scaling.context_parallel=2: an elastic run "
                                              r"resizes by whole groups of 2 .* e.g. \[2, 4\]"):
        Config.model_validate(_cfg(context_parallel=2, num_workers=[3, 4], launcher="ray"))
    with pytest.raises(ValidationError, match="train.stage=kto it is not supported yet"):
        Config.model_validate({**_cfg(context_parallel=2), "train": {"stage": "kto"}})
    Config.model_validate({**_cfg(context_parallel=2), "train": {"stage": "dpo"}})  # pairs: both sides on a group


def test_an_elastic_range_with_context_parallelism_keeps_the_global_batch_over_data_parallel_ranks():
    from pydantic import ValidationError

    from scaletrain.config.batch import for_world_size
    from scaletrain.config.schema import Config

    cfg = Config.model_validate({**_cfg(context_parallel=2, num_workers=[2, 8], launcher="ray"),
                                 "train": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 3}})
    assert cfg.scaling.elastic and cfg.scaling.data_parallel == 4  # the run's global batch: 12 sequences
    for world, accum in ((8, 3), (6, 4), (4, 6), (2, 12)):  # 4, 3, 2, 1 data-parallel ranks
        at = for_world_size(cfg, world)
        assert at.train.gradient_accumulation_steps == accum and at.scaling.data_parallel == world // 2
    with pytest.raises(ValueError, match="in groups of 2 context-parallel ranks"):
        for_world_size(cfg, 5)
    with pytest.raises(ValidationError, match=r"cannot be split over 3 worker\(s\).*data-parallel ranks"):
        Config.model_validate({**_cfg(context_parallel=2, num_workers=[6, 8], launcher="ray"),
                               "train": {"per_device_train_batch_size": 1}})  # 3 data-parallel ranks of 4


def test_the_global_batch_counts_data_parallel_ranks_only():
    from scaletrain.config.batch import total_steps
    from scaletrain.config.schema import Config

    cfg = Config.model_validate({**_cfg(context_parallel=2), "train": {"per_device_train_batch_size": 2,
                                                                       "num_train_epochs": 1}})
    assert total_steps(40, cfg, cfg.scaling.data_parallel) == 10  # 40 / (2 x 2 data-parallel ranks)


def _model_dir(tmp_path, name: str, **config) -> str:
    import json

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 512, **config}))
    return str(d)


def test_the_driver_refuses_a_model_context_parallelism_cannot_split(tmp_path):
    """Before any worker starts: heads that ulysses cannot divide (the ring can), a sliding window, soft-capping."""
    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.build import context_parallel_error
    from scaletrain.model.tokenizer import Vocab

    vocab = Vocab(512, 0)
    llama = ModelConfig(name_or_path=_model_dir(tmp_path, "llama"), task="causal-lm")
    assert context_parallel_error(llama, vocab, 4, "auto") is None  # 6 heads over 4: the ring
    with pytest.raises(ConfigError, match="6 attention heads do not divide .* context_parallel_method: ring"):
        context_parallel_error(llama, vocab, 4, "ulysses")
    windowed = ModelConfig(name_or_path=_model_dir(tmp_path, "mistral", model_type="mistral",
                                                   architectures=["MistralForCausalLM"], sliding_window=4096),
                           task="causal-lm")
    assert "sliding window" in context_parallel_error(windowed, vocab, 2, "auto")


def test_the_attention_kernels_said_at_start_follow_the_architecture():
    from types import SimpleNamespace as NS

    from scaletrain.model.attention import kernel_note

    mi300x = NS(gcnArchName="gfx942:sramecc+:xnack-")
    assert "AOTriton flash and memory-efficient (gfx942)" in kernel_note("cuda:0", mi300x, hip=True)
    rdna = kernel_note("cuda:0", NS(gcnArchName="gfx1100"), hip=True, env={})
    assert "math backend without a word" in rdna and "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1" in rdna
    assert "experimental on RDNA" in kernel_note("cuda:0", NS(gcnArchName="gfx1100"), hip=True,
                                                 env={"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"})
    assert kernel_note("cuda:0", NS(major=9, minor=0)) == "attention kernels: flash, memory-efficient, cuDNN (sm_90)"
    assert "memory-efficient only (flash needs sm_80" in kernel_note("cuda:0", NS(major=7, minor=0))
    assert "turned off" in kernel_note("cuda:0", NS(major=8, minor=0), flash_enabled=False)
    assert "CPU flash kernel" in kernel_note("cpu")

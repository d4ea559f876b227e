"""`plan` weighs context parallelism for long sequences: Llama-3.1-8B's released config.json (alone), full
fine-tuning in bf16 under FSDP with activation checkpointing on 8 H100s: 256k tokens do not fit one device's share
of a sequence and need context_parallel 2; 64k tokens fit without it, and a configured degree is then said to be
wasted traffic. A rank's activations halve with ulysses at degree 2; the ring keeps the whole sequence's keys
and values of the recomputed layer on top."""

import json

import pytest

from scaletrain.config import validate
from scaletrain.memory.estimate import GIB, estimate, gathered_kv
from scaletrain.memory.plan import (
    context_parallel_lines,
    context_parallel_options,
    device_named,
    shape_for,
    with_context_parallel,
)
from scaletrain.model.tokenizer import plan_vocab

# huggingface.co/meta-llama/Llama-3.1-8B, config.json
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
               "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "bos_token_id": 128000, "eos_token_id": 128001}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-3.1-8b")
    (d / "config.json").write_text(json.dumps(LLAMA_31_8B))
    return d


def _cfg(path, tokens: int, **scaling):
    return validate({"model": {"name_or_path": str(path), "task": "causal-lm", "finetuning_type": "full"},
                     "data": {"train_file": "unused.jsonl", "max_length": tokens},
                     "train": {"strategy": "fsdp", "bf16": True, "per_device_train_batch_size": 1,
                               "gradient_checkpointing": True},
                     "scaling": {"num_workers": 8, **scaling}})


def test_256k_tokens_need_context_parallel_2_on_8_h100(llama):
    cfg = _cfg(llama, 262144)
    h100 = device_named("h100")
    rows = context_parallel_options(cfg, plan_vocab(str(llama)), [8], h100, (1, 2))
    one, two = rows
    assert not one["fits"] and two["fits"]
    # ulysses at degree 2: a rank's activations are half of degree 1's (the same layers at half the positions)
    assert two["activations_gib"] == pytest.approx(one["activations_gib"] / 2, rel=0.05)
    assert two["traffic_mb_per_layer"] > 0 and one["traffic_mb_per_layer"] == 0
    line, = context_parallel_lines(cfg, rows, h100)
    assert line.startswith("8 device(s): needs scaling.context_parallel=2 (")


def test_64k_fits_without_it_and_an_asked_degree_is_wasted_traffic(llama):
    cfg = _cfg(llama, 65536, context_parallel=2)
    mi300x = device_named("mi300x")
    rows = context_parallel_options(cfg, plan_vocab(str(llama)), [8], mi300x, (1, 2))
    assert all(r["fits"] for r in rows)
    line, = context_parallel_lines(cfg, rows, mi300x)
    assert "fit without context parallelism" in line and "context_parallel=2 is not needed" in line


def test_the_ring_keeps_the_whole_sequences_keys_and_values(llama):
    ring = with_context_parallel(_cfg(llama, 65536, context_parallel_method="ring"), 4, 8)
    shape = shape_for(ring, plan_vocab(str(llama)))
    assert shape.seq == 65536 // 4 and shape.kv_width == 8 * 128
    # one recomputed layer's keys and values of the other 3 ranks' positions, fp32 counted (halved in bf16 later)
    assert gathered_kv(ring, shape) == 16384 * 3 * 2 * 1024 * 4
    ulysses = ring.model_copy(update={"scaling": ring.scaling.model_copy(update={"context_parallel_method": "auto"})})
    assert gathered_kv(ulysses, shape) == 0
    assert estimate(ring, shape, 8, "gpu").activations - estimate(ulysses, shape, 8, "gpu").activations \
        == gathered_kv(ring, shape) // 2
    assert estimate(ring, shape, 8, "gpu").peak < 80 * GIB

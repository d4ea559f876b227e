"""The chunked loss through the worker loop: the same loss curve and eval loss as the plain path."""

import pytest

from scaletrain.launch.local import run_in_process
from tests.conftest import local_spec, train_losses


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.parametrize("packing", [False, True])
def test_a_chunked_run_trains_the_plain_runs_curve(tmp_path, demo_dir, packing):
    runs = {}
    for chunk in (0, 16):
        job = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
               "data": {"train_file": str(demo_dir / "alpaca.json"), "max_length": 64, "packing": packing},
               "train": {"per_device_train_batch_size": 4, "max_steps": 4, "logging_steps": 1, "learning_rate": 1e-3,
                         "loss_chunk_tokens": chunk, "seed": 5}}
        _, _, spec = local_spec(job, tmp_path / f"chunk-{chunk}")
        runs[chunk] = (run_in_process(spec), train_losses(tmp_path / f"chunk-{chunk}"))
    (plain, plain_losses), (chunked, chunked_losses) = runs[0], runs[16]
    log = (tmp_path / "chunk-16" / "logs" / "main.log").read_text()
    assert "loss in chunks of 16 tokens" in log and "loss in chunks" not in (tmp_path / "chunk-0" / "logs" /
                                                                             "main.log").read_text()
    assert len(plain_losses) == 4 and chunked_losses == pytest.approx(plain_losses, rel=1e-5)
    assert chunked["final"]["eval/loss"] == pytest.approx(plain["final"]["eval/loss"], rel=1e-5)


def test_the_default_chunk_follows_the_models_vocabulary_not_the_tokenizers(tmp_path, demo_dir):
    """A 32k-vocabulary model with a small tokenizer (as a padded hub vocabulary): chunked by default."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    d = tmp_path / "llama-32k"
    LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).to(torch.bfloat16).save_pretrained(d)
    tiny_llama_tokenizer().save_pretrained(d)
    job = {"model": {"name_or_path": str(d), "task": "causal-lm"},
           "data": {"train_file": str(demo_dir / "alpaca.json"), "max_length": 64},
           "train": {"per_device_train_batch_size": 4, "max_steps": 1}}
    _, _, spec = local_spec(job, tmp_path / "run")
    run_in_process(spec)
    assert "loss in chunks of 2097 tokens" in (tmp_path / "run" / "logs" / "main.log").read_text()
